"""Paired per-call differences of two alternated arms in this folder: for each case, after -
before of the median CPU us per call within each process pair, mean and 95 % t-interval over
the n pairs (n - 1 degrees of freedom), and the mean relative change.

    python benchmarks/results/issue21/xeon/calls/paired_calls.py PREFIX_BEFORE PREFIX_AFTER [FILTER]

e.g. ``before after`` (the row changes), ``sr_before sr_after``, ``inl_before inl_after``,
``bf16_compiled_here bf16_from_cache`` (files ``<prefix>_<i>.json``, i = 1, 2, ...).  With
the arms the other way round (``bf16_from_cache bf16_compiled_here``) the difference is what
compiling in the process costs."""

import json
import statistics
import sys
from pathlib import Path

from snip.compare.stats import t_interval

HERE = Path(__file__).parent


def load(prefix: str) -> list[dict]:
    runs, i = [], 1
    while (HERE / f"{prefix}_{i}.json").exists():
        runs.append(json.loads((HERE / f"{prefix}_{i}.json").read_text())["calls"])
        i += 1
    return runs


def main() -> None:
    before, after = load(sys.argv[1]), load(sys.argv[2])
    flt = sys.argv[3] if len(sys.argv) > 3 else ""
    n = min(len(before), len(after))
    print(f"n = {n} process pairs; after - before, us per call, mean [95% t-interval], relative")
    for case in before[0]:
        if flt not in case:
            continue
        d = [after[i][case]["us"] - before[i][case]["us"] for i in range(n)]
        b = statistics.mean(before[i][case]["us"] for i in range(n))
        m, lo, hi = t_interval(d)
        tag = "resolved" if lo > 0 or hi < 0 else "unresolved"
        print(f"{case:50s} {b:8.1f} {m:+8.1f} [{lo:+8.1f}, {hi:+8.1f}] {m / b:+7.1%} {tag}")


if __name__ == "__main__":
    main()
