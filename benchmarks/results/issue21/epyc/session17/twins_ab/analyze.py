"""The pre-registered analysis of PLAN.md here: per model and preset, the mean over processes
of each process's mean (twins on - off) of ``cpu_vs_fp32``, with a 95 % t-interval (n =
processes, the independent units).  Reads the ``proc_*.json`` of this folder or of the folder
given.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session17/twins_ab/analyze.py [DIR]
"""

import json
import sys
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
runs = [json.loads(p.read_text()) for p in sorted(HERE.glob("proc_*.json"))]
print(f"n = {len(runs)} processes; twins on - off of cpu_vs_fp32, mean [95% t-interval]")
for model, arms in runs[0]["models"].items():
    for arm in arms:
        m, lo, hi = t_interval([r["models"][model][arm]["diff_mean"] for r in runs])
        verdict = "lower" if hi < 0 else "higher" if lo > 0 else "unresolved"
        print(f"{model:10s} {arm:8s} {m:+.4f} [{lo:+.4f}, {hi:+.4f}]  {verdict}")
