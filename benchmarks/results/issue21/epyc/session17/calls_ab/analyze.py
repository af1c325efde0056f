"""PLAN.md's analysis: per kind of call, the mean over processes of each process's mean
(twins on - off) of the block-median call time, with a 95 % t-interval (n = processes), and
the off level, and the interval's upper end as a share of the off level (session 18's
margin).  Reads the ``proc_*.json`` of this folder or of the folder given.

    PYTHONPATH=src python benchmarks/results/issue21/epyc/session17/calls_ab/analyze.py [DIR]
"""

import json
import statistics
import sys
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
runs = [json.loads(p.read_text()) for p in sorted(HERE.glob("proc_*.json"))]
print(f"n = {len(runs)} processes; twins on - off, us a call, mean [95% t-interval]")
for kind in runs[0]["kinds"]:
    m, lo, hi = t_interval([r["kinds"][kind]["diff_us"] for r in runs])
    off = statistics.mean(statistics.mean(r["kinds"][kind]["off_us"]) for r in runs)
    verdict = "lower" if hi < 0 else "higher" if lo > 0 else "unresolved"
    print(f"{kind:40s} off {off:7.1f} us  {m:+6.2f} [{lo:+6.2f}, {hi:+6.2f}]  {verdict}"
          f"  (upper end {100 * hi / off:+5.1f} % of off)")
