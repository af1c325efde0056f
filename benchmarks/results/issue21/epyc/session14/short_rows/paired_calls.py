"""PLAN.md's one-call analysis: per run pair, the geometric mean of after / before call time
over each group of cases, then mean and 95 % t-interval over the pairs; and each ``short``
case's mean ratio.

    python benchmarks/results/issue21/epyc/session14/short_rows/paired_calls.py
"""

import json
import math
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(__file__).parent
TILES = ("fp8_e4m3_tile128", "fp4_e2m1_tile128")


def group(case: str) -> str:
    preset, shape, _, axis, rounding, *placed = case.split()
    width = int(shape.split("x")[1])
    if preset in TILES and axis == "-1" and rounding == "stochastic" and not placed:
        return "whole" if width % 128 == 0 else "short"
    return "other"


def main() -> None:
    pairs = []
    i = 1
    while (HERE / f"calls_before_{i}.json").exists() and (HERE / f"calls_after_{i}.json").exists():
        b, a = (json.loads((HERE / f"calls_{arm}_{i}.json").read_text())["calls"]
                for arm in ("before", "after"))
        pairs.append({k: a[k]["us"] / b[k]["us"] for k in b if k in a})
        i += 1
    print(f"n = {len(pairs)} run pairs; after / before call time, geometric mean per group")
    for g in ("short", "whole", "other"):
        gm = [math.exp(sum(math.log(r) for k, r in p.items() if group(k) == g)
                       / sum(1 for k in p if group(k) == g)) for p in pairs]
        mean, lo, hi = t_interval(gm)
        cases = sum(1 for k in pairs[0] if group(k) == g)
        print(f"{g:6s} ({cases:3d} cases)  {mean:.3f} [{lo:.3f}, {hi:.3f}]")
    print("short cases, mean ratio over the pairs:")
    for k in sorted(k for k in pairs[0] if group(k) == "short"):
        print(f"  {k:50s} {sum(p[k] for p in pairs) / len(pairs):.3f}")


if __name__ == "__main__":
    main()
