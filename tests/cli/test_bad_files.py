"""Malformed input files are one-line errors (exit 2), not tracebacks (issue 14)."""

from __future__ import annotations

from pathlib import Path

import pytest

from snip.cli import main


def _err(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("content", [b"", b"not a zip file at all", b"PK\x03\x04broken"])
def test_audit_bad_trace_file(content: bytes, tmp_path: Path,
                              capsys: pytest.CaptureFixture) -> None:
    trace = tmp_path / "trace.npz"
    trace.write_bytes(content)
    out = tmp_path / "out"
    assert main(["audit", "--trace", str(trace), "--out", str(out)]) == 2
    assert "is not a snip reference trace" in _err(capsys)
    assert not out.exists()


@pytest.mark.parametrize("lines", ["[1, 2]\n3\n\"text\"\n", "null\n"])
def test_report_on_metrics_that_are_not_events(lines: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(lines)
    assert main(["report", str(run)]) == 2
    assert "holds no snip metrics events" in _err(capsys)


def test_report_skips_foreign_lines_among_events(tmp_path: Path) -> None:
    from snip.report import load_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"event": "train", "step": 1, "loss": 2.0}\n[1]\n'
                                       '{"event": "train", "step": 2, "loss": 1.5}\n')
    assert [e["step"] for e in load_run(run).events] == [1, 2]


@pytest.mark.parametrize("content", ["[1, 2]", '"text"', "3"])
def test_json_inputs_that_are_not_objects(content: str, tmp_path: Path) -> None:
    from snip.errors import UserError

    f = tmp_path / "x.json"
    f.write_text(content)
    for load in _JSON_READERS():
        with pytest.raises(UserError, match="must hold a JSON object"):
            load(f)


def _JSON_READERS() -> tuple:
    from snip.data.tokenizer import load_tokenizer
    from snip.optim.mask import TileMask
    from snip.plan import PrecisionPlan, ThroughputProfile
    from snip.sensitivity.table import SensitivityTable

    return (TileMask.load, load_tokenizer, SensitivityTable.from_json, PrecisionPlan.from_json,
            ThroughputProfile.from_json)


@pytest.mark.parametrize("content, message", [
    (b'{"a": 1,\n "b": }', r"x\.json is not valid JSON: line 2, column 7"),
    (b"\xff\xfe\x00garbage", r"cannot read .*x\.json: not UTF-8 text"),
])
def test_json_inputs_that_are_not_json_name_the_file_in_one_voice(
        content: bytes, message: str, tmp_path: Path) -> None:
    from snip.errors import UserError

    f = tmp_path / "x.json"
    f.write_bytes(content)
    for load in _JSON_READERS():
        with pytest.raises(UserError, match=message):
            load(f)


def test_a_missing_json_input_is_a_missing_file_error(tmp_path: Path) -> None:
    from snip.errors import MissingFileError

    for load in _JSON_READERS():
        missing = r"nope\.json.* (does not exist|nor an existing JSON file)"
        with pytest.raises(MissingFileError, match=missing):
            load(tmp_path / "nope.json")
