"""Added after PLAN.md was written (not pre-registered; descriptive): the adaptive SNIP step
averaged over one re-plan period, its statistics cycle included -- the figure issue 21 asks
for -- from the same runs. ``amortized_vs_fp32`` of each run's ``adaptive`` record, and of its
``adaptive@auto`` record where the runs had ``--auto`` (wall time: ``(step + cycle / every) /
fp32 step``); mean and 95 % t-interval over the runs, per model.
Works on any folder of ``run_<i>.json`` or ``after_<i>.json`` files.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session11/targets/adaptive_period.py \
        [FOLDER [PREFIX [THREADS]]]

(``THREADS``, session 20: the runs' thread count, 1 by default.)
"""

import json
import sys
from pathlib import Path

from snip.compare.stats import t_interval

here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
prefix = sys.argv[2] if len(sys.argv) > 2 else "run"
threads = sys.argv[3] if len(sys.argv) > 3 else "1"
runs = []
i = 1
while (here / f"{prefix}_{i}.json").exists():
    runs.append(json.loads((here / f"{prefix}_{i}.json").read_text())["runs"][threads]["models"])
    i += 1
print(f"n = {len(runs)} runs; adaptive step averaged over a re-plan period / fp32 step (wall), "
      "mean [95% t-interval]")
for model in runs[0]:
    for key in ("adaptive", "adaptive@auto"):  # (the second where the runs had --auto)
        if key not in runs[0][model]:
            continue
        m, lo, hi = t_interval([r[model][key]["amortized_vs_fp32"] for r in runs])
        cyc = sum(r[model][key]["cycle_step_equivalents"] for r in runs) / len(runs)
        print(f"{model + key.removeprefix('adaptive'):10s} {m:5.3f} [{lo:5.3f}, {hi:5.3f}]  "
              f"(a cycle: {cyc:.1f} steps, every {runs[0][model][key]['every']})")
