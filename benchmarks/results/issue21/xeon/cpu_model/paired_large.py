"""Paired v3 - host of ms per call for every snip row of the large-tensor runs in this folder
(``large_{host,v3}_<i>.json``; the analysis of PLAN_large.md): per row, the mean relative change
over the pairs, each pair's change, and whether both pairs moved it the same way by > 5 %.
Added after the runs, beside that pre-registered rule: the paired difference in ms with its 95 %
t-interval over the n pairs (n - 1 degrees of freedom).

    python benchmarks/results/issue21/xeon/cpu_model/paired_large.py
"""

import json
import statistics
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(__file__).parent


def load(arm: str) -> list[dict[str, float]]:
    runs, i = [], 1
    while (HERE / f"large_{arm}_{i}.json").exists():
        runs.append(json.loads((HERE / f"large_{arm}_{i}.json").read_text()))
        i += 1
    return runs


def main() -> None:
    host, v3 = load("host"), load("v3")
    n = min(len(host), len(v3))
    print(f"n = {n} process pairs; ms per call (host mean), v3 / host - 1 per pair")
    for row in host[0]:
        if not row.startswith("snip "):
            continue
        rel = [v3[i][row] / host[i][row] - 1 for i in range(n)]
        same = all(r > 0.05 for r in rel) or all(r < -0.05 for r in rel)
        tag = ("faster" if rel[0] < 0 else "slower") if same else "unchanged"
        pairs = " ".join(f"{100 * r:+6.1f}%" for r in rel)
        base = 1e3 * statistics.mean(h[row] for h in host[:n])  # the JSON holds seconds
        d = [1e3 * (v3[i][row] - host[i][row]) for i in range(n)]
        m, lo, hi = t_interval(d)
        ci = "resolved" if lo > 0 or hi < 0 else "unresolved"
        print(f"{row:34s} {base:8.2f} ms  {pairs}  mean {100 * statistics.mean(rel):+6.1f}%"
              f"  {tag:9s}  {m:+6.2f} ms [{lo:+6.2f}, {hi:+6.2f}] {ci}")


if __name__ == "__main__":
    main()
