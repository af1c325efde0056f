"""`snip formats`: every preset is told apart from the others by some column."""

from __future__ import annotations

import json

from snip.cli import main


def test_every_preset_row_differs_from_every_other(capsys) -> None:
    assert main(["formats"]) == 0
    table = capsys.readouterr().out.split("Presets\n")[1].split("\n\n")[0].splitlines()[1:]
    # the rows without their name: mxfp4 vs mxfp4_rht (nvfp4 vs nvfp4_rht) differ only in the
    # Hadamard transform, so without that column they would be identical
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in table}
    assert rows["mxfp4_rht"].endswith("RHT 32") and rows["nvfp4_rht"].endswith("RHT 16")
    assert len(set(rows.values())) == len(rows)
    assert main(["formats", "--json"]) == 0
    presets = json.loads(capsys.readouterr().out)["presets"]
    assert presets["mxfp4_rht"]["hadamard"] == 32 and presets["mxfp4"]["hadamard"] == 0
