"""The pre-registered analysis of PLAN.md here: per ratio of whole-run wall times (session 12's
``e2e_paired.ratios``: ``train_fp32 / loop_fp32`` and ``train_mxfp4 / loop_mxfp4``, issue 21's
1.2x target, and the rest), the mean over the ``run_<i>.json`` processes with its 95 %
t-interval, and for the two target ratios the verdict against 1.2.  Reads the runs of this
folder or of the folder given.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session17/e2e_zen3/e2e_levels.py [DIR]
"""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location(
    "e2e_paired", HERE.parents[1] / "session12" / "e2e_paired.py")
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)

RUNS = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
runs = [e2e.ratios(p) for p in sorted(RUNS.glob("run_*.json"))]
print(f"n = {len(runs)} processes; whole-run wall-time ratios, mean [95% t-interval]")
for name in e2e.RATIOS:
    m, lo, hi = e2e.interval([r[name] for r in runs])
    line = f"{name:36s} {m:.3f} [{lo:.3f}, {hi:.3f}]"
    if name in e2e.TARGETED:
        line += f"  {e2e.verdict(lo, hi)} (1.2)"
    print(line)
