"""How close does each tolerance in the test suite come to failing? (a pytest plugin, issue 20)

Loaded into a test run, it wraps ``pytest.approx`` and ``torch.testing.assert_close`` and records,
for every comparison with a tolerance, the observed error over the allowed error (0: bitwise
equal, 1: at the limit).  At the end it writes the worst ratio per source line, largest first, to
``$MARGINS_OUT`` (default ``benchmarks/out/tolerance_margins.json``).  A line near 1 passes by a
hair and would fail on the next CPU; run it under ``ATEN_CPU_CAPABILITY=avx2`` and with
``OMP_NUM_THREADS=1`` too.

Usage::

    PYTHONPATH=benchmarks .venv/bin/pytest -q -p tolerance_margins tests/sensitivity tests/models
"""

from __future__ import annotations

import inspect
import json
import math
import os
from pathlib import Path

import pytest
import torch

RECORDS: list[tuple[str, float, float | None, float | None]] = []
_approx = pytest.approx
_assert_close = torch.testing.assert_close


def _caller() -> str:
    for frame in inspect.stack()[2:]:
        if "/tests/" in frame.filename:
            return f"{os.path.relpath(frame.filename)}:{frame.lineno}"
    return "?"


class _Recorded:
    """``pytest.approx`` that also records how much of its tolerance a comparison used."""

    def __init__(self, expected, rel=None, abs=None, nan_ok=False):  # noqa: A002 (approx's names)
        self.inner = _approx(expected, rel=rel, abs=abs, nan_ok=nan_ok)
        self.expected, self.rel, self.abs, self.where = expected, rel, abs, _caller()

    def __eq__(self, actual) -> bool:
        ok = self.inner == actual
        try:
            exp = self.expected if isinstance(self.expected, list | tuple) else [self.expected]
            act = actual if isinstance(actual, list | tuple) else [actual]
            rel = self.rel if self.rel is not None else (1e-6 if self.abs is None else 0.0)
            ab = self.abs if self.abs is not None else (1e-12 if self.rel is None else 0.0)
            worst = 0.0
            for a, e in zip(act, exp, strict=False):
                tol = max(rel * abs(float(e)), ab)
                err = abs(float(a) - float(e))
                worst = max(worst, err / tol if tol > 0 else (0.0 if err == 0 else math.inf))
            RECORDS.append((self.where, worst, self.rel, self.abs))
        except (TypeError, ValueError):  # dicts, arrays: compared, not recorded
            pass
        return ok

    def __ne__(self, actual) -> bool:
        return not self.__eq__(actual)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self.inner)


def _recorded_assert_close(actual, expected, *args, rtol=None, atol=None, **kwargs):
    if rtol is not None and atol is not None and (rtol > 0 or atol > 0):
        x, y = torch.as_tensor(actual).double(), torch.as_tensor(expected).double()
        ratio = ((x - y).abs() / (atol + rtol * y.abs())).nan_to_num(0).max().item()
        RECORDS.append((_caller(), ratio, rtol, atol))
    return _assert_close(actual, expected, *args, rtol=rtol, atol=atol, **kwargs)


pytest.approx = _Recorded
torch.testing.assert_close = _recorded_assert_close


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    worst: dict[str, tuple[float, float | None, float | None]] = {}
    for where, ratio, rel, ab in RECORDS:
        if where not in worst or ratio > worst[where][0]:
            worst[where] = (ratio, rel, ab)
    rows = [{"ratio": r, "where": w, "rel": rel, "abs": ab}
            for w, (r, rel, ab) in sorted(worst.items(), key=lambda kv: -kv[1][0])]
    out = Path(os.environ.get("MARGINS_OUT",
                              Path(__file__).resolve().parent / "out" / "tolerance_margins.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows}, indent=1))
