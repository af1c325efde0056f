"""Paired after - before of cpu_vs_fp32 per model and arm over the run pairs in a folder
(the pre-registered analysis of its PLAN.md): mean and 95 % t-interval, n = run pairs.
``METRIC`` picks another ratio of the JSON (``vs_fp32``: wall time, for 2-thread runs).

    python benchmarks/results/issue21/xeon/short_rows/paired.py [FOLDER [METRIC]]
"""

import json
import statistics
import sys
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(__file__).parent


def ratios(path: Path, metric: str = "cpu_vs_fp32") -> dict[tuple[str, str], float]:
    runs = json.loads(path.read_text())["runs"]
    return {(m, a): v[metric] for r in runs.values() for m, mv in r["models"].items()
            for a, v in mv["arms"].items() if metric in v}


def main() -> None:
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    metric = sys.argv[2] if len(sys.argv) > 2 else "cpu_vs_fp32"
    pairs = []
    i = 1
    while (here / f"before_{i}.json").exists() and (here / f"after_{i}.json").exists():
        pairs.append((ratios(here / f"before_{i}.json", metric),
                      ratios(here / f"after_{i}.json", metric)))
        i += 1
    n = len(pairs)
    print(f"n = {n} run pairs; after - before of {metric}, mean [95% t-interval]")
    for key in pairs[0][0]:
        if key[1] == "fp32":
            continue
        d = [a[key] - b[key] for b, a in pairs]
        before = statistics.mean(b[key] for b, _ in pairs)
        after = statistics.mean(a[key] for _, a in pairs)
        m, lo, hi = t_interval(d)
        tag = "resolved" if lo > 0 or hi < 0 else "unresolved"
        print(f"{key[0]:10s} {key[1]:18s} {before:5.2f} -> {after:5.2f}  {m:+.3f} "
              f"[{lo:+.3f}, {hi:+.3f}]  {tag}")


if __name__ == "__main__":
    main()
