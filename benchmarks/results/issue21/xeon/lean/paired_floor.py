"""Paired after - before of CPU us per layer step at the floor shape (16 x 16 -> 16), per arm,
over the process pairs in this folder (the pre-registered layer-level analysis of PLAN.md):
each run's median of its rounds, then the mean difference and its 95 % t-interval, n = pairs.

    python benchmarks/results/issue21/xeon/lean/paired_floor.py [FOLDER]
"""

import json
import statistics
import sys
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(__file__).parent


def medians(path: Path) -> dict[str, float]:
    rounds = json.loads(path.read_text())["floor"]["rounds"]
    return {arm: statistics.median(v) for arm, v in rounds.items()}


def main() -> None:
    here = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    pairs = []
    i = 1
    while (here / f"floor_before_{i}.json").exists() and (here / f"floor_after_{i}.json").exists():
        pairs.append((medians(here / f"floor_before_{i}.json"),
                      medians(here / f"floor_after_{i}.json")))
        i += 1
    n = len(pairs)
    print(f"n = {n} process pairs; CPU us per layer step, after - before, mean [95% t-interval]")
    for arm in pairs[0][0]:
        d = [a[arm] - b[arm] for b, a in pairs]
        before = statistics.mean(b[arm] for b, _ in pairs)
        after = statistics.mean(a[arm] for _, a in pairs)
        m, lo, hi = t_interval(d)
        tag = "resolved" if lo > 0 or hi < 0 else "unresolved"
        print(f"{arm:18s} {before:6.1f} -> {after:6.1f}  {m:+6.1f} [{lo:+6.1f}, {hi:+6.1f}]"
              f"  {100 * m / before:+5.1f} %  {tag}")


if __name__ == "__main__":
    main()
