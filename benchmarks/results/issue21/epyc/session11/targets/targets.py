"""The pre-registered analysis of this folder's PLAN.md: per model and arm, the mean and 95 %
t-interval of ``cpu_vs_fp32`` over the runs (n = runs), and its verdict against issue 21's
bound (1.15 at width >= 128, 1.3 at ``tiny-deep``; and 1.05 for ``bf16``, with fp32 GEMMs or
``bf16@auto``'s): inside (upper end
<= bound), outside (lower end > bound), else unresolved.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session11/targets/targets.py \
        [FOLDER [THREADS]]

``THREADS`` (session 20): the runs' thread count, 1 by default; above 1 the metric is the wall
time's ratio ``vs_fp32`` (CPU time adds up both threads' work).
"""

import json
import sys
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(__file__).parent
BOUND = 1.15
MODEL_BOUND = {"tiny-deep": 1.3}  # (width 64; every other model is width >= 128)
BF16_BOUND = 1.05
BASELINES = ("fp32", "bf16_autocast", "snip_fp32")


def verdict(lo: float, hi: float, bound: float) -> str:
    return "inside" if hi <= bound else "outside" if lo > bound else "unresolved"


def main() -> None:
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    threads = sys.argv[2] if len(sys.argv) > 2 else "1"
    metric = "cpu_vs_fp32" if threads == "1" else "vs_fp32"
    runs = []
    i = 1
    while (here / f"run_{i}.json").exists():
        data = json.loads((here / f"run_{i}.json").read_text())["runs"][threads]["models"]
        runs.append({(m, a): v[metric] for m, mv in data.items()
                     for a, v in mv["arms"].items()})
        i += 1
    print(f"n = {len(runs)} runs; {metric}, mean [95% t-interval]; bound {BOUND} "
          f"(tiny-deep {MODEL_BOUND['tiny-deep']}; {BF16_BOUND} also for bf16)")
    for key in runs[0]:
        if key[1] == "fp32":
            continue
        m, lo, hi = t_interval([r[key] for r in runs])
        line = f"{key[0]:10s} {key[1]:18s} {m:5.3f} [{lo:5.3f}, {hi:5.3f}]"
        if key[1] not in BASELINES:
            line += f"  {verdict(lo, hi, MODEL_BOUND.get(key[0], BOUND))}"
            if key[1].partition("@")[0] == "bf16":
                line += f"; vs {BF16_BOUND}: {verdict(lo, hi, BF16_BOUND)}"
        print(line)


if __name__ == "__main__":
    main()
