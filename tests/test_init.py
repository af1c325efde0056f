"""``import snip`` is cheap and every subpackage is reachable from it lazily (PEP 562)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import snip

SRC = str(Path(snip.__file__).resolve().parents[1])


def _python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout


def test_import_snip_loads_no_torch_until_a_name_is_used():
    out = _python("import sys, snip\n"
                  "print('torch' in sys.modules, 'snip.formats' in sys.modules)\n"
                  "snip.quantize\n"
                  "print('torch' in sys.modules, 'snip.formats' in sys.modules)\n"
                  "print(sorted(m for m in sys.modules if m.startswith('snip.'))[:1])")
    assert out.split("\n")[:2] == ["False False", "True True"]


def test_subpackages_load_lazily():
    names = ["audit", "optim", "planner", "sensitivity", "models", "data", "train", "report"]
    out = _python("import sys, snip\n"
                  f"print([n for n in {names!r} if f'snip.{{n}}' in sys.modules])\n"
                  f"for n in {names!r}:\n"
                  "    print(n, getattr(snip, n).__name__, f'snip.{n}' in sys.modules)")
    lines = out.split("\n")
    assert lines[0] == "[]"  # nothing loaded by import snip
    assert lines[1:1 + len(names)] == [f"{n} snip.{n} True" for n in names]


def test_top_level_names_and_errors():
    assert snip.quantize is snip.formats.quantize and snip.convert is snip.nn.convert
    assert snip.PrecisionPlan is snip.plan.PrecisionPlan and "audit" in dir(snip)
    assert callable(snip.audit.invisible)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        snip.nope  # noqa: B018
    from snip import QuantSpec, audit  # from-imports go through __getattr__ too

    assert audit is snip.audit and QuantSpec is snip.QuantSpec
