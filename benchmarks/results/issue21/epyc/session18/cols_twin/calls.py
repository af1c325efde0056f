"""Session 18's measurement of the column kernel's one-thread twin after ``_absbits`` was typed
int32 (PLAN.md here): session 17's ``calls_ab.py`` (twins off and on by turns in one process,
1 thread) on this folder's kinds of call.  Writes the process's JSON.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session18/cols_twin/calls.py OUT
"""

import importlib.util
from pathlib import Path

from snip.formats import Rounding

_AB = Path(__file__).parents[2] / "session17" / "calls_ab" / "calls_ab.py"
_spec = importlib.util.spec_from_file_location("calls_ab", _AB)
ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab)

RNE, SR = Rounding.RNE, Rounding.STOCHASTIC
ab.KINDS = [("mxfp4", (1024, 128), 0, SR), ("mxfp4", (1024, 128), 0, RNE),
            ("mxfp4", (4096, 352), 0, SR), ("fp8_e4m3_tile128", (4096, 128), 0, RNE),
            ("nvfp4", (4096, 128), 0, SR), ("mxfp4", (64, 128), -1, RNE)]

if __name__ == "__main__":
    ab.main()
