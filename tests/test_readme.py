"""Every ```python block of README.md runs as written (each in a fresh namespace, in a
temporary working directory so files it writes, like ``plan.json``, land there).  A block whose
first line is ``# needs: a, b`` is skipped (not failed) where one of those packages is not
installed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 5
    assert any("snip.audit.invisible(" in b for b in BLOCKS)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs(code: str, tmp_path: Path, monkeypatch) -> None:
    import torch

    first = code.splitlines()[0]
    if first.startswith("# needs:"):
        for package in first.removeprefix("# needs:").split(","):
            pytest.importorskip(package.strip())
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
