"""The pre-registered analysis of ``e2e_t1/PLAN.md`` and ``e2e_t2/PLAN.md``: session 17's
``e2e_levels.py`` (the same ratios, means and 95 % t-intervals over the ``run_<i>.json``
processes, verdicts against 1.2), with the ``@auto`` pair added: ``train_mxfp4@auto /
loop_mxfp4@auto`` (issue 21's target, with `--precision.accum auto`) and its control
``loop_mxfp4@auto / loop_plain``.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session20/e2e_levels_auto.py DIR
"""

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "e2e_paired", Path(__file__).parents[1] / "session12" / "e2e_paired.py")
e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(e2e)
e2e.RATIOS["train_mxfp4@auto / loop_mxfp4@auto"] = ("train_mxfp4@auto", "loop_mxfp4@auto")
e2e.RATIOS["loop_mxfp4@auto / loop_plain (control)"] = ("loop_mxfp4@auto", "loop_plain")
TARGETED = (*e2e.TARGETED, "train_mxfp4@auto / loop_mxfp4@auto")

runs = [e2e.ratios(p) for p in sorted(Path(sys.argv[1]).glob("run_*.json"))]
print(f"n = {len(runs)} processes; whole-run wall-time ratios, mean [95% t-interval]")
for name in e2e.RATIOS:
    m, lo, hi = e2e.interval([r[name] for r in runs])
    line = f"{name:40s} {m:.3f} [{lo:.3f}, {hi:.3f}]"
    if name in TARGETED:
        line += f"  {e2e.verdict(lo, hi)} (1.2)"
    print(line)
