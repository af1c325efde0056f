"""Planner solve time on a Llama-2-70B-shaped problem (target: < 1 s per solve).

80 blocks x 7 linear layers, real 70B shapes (dim 8192, GQA kv 1024, ffn 28672), 4 candidate
formats (bf16, mxfp8_e4m3, mxfp4, nvfp4), decided per GEMM: 1680 units x 4 formats = 6720
binaries.  Times ``snip.planner.solve`` (problem build + HiGHS + plan construction) for several
budgets and, as the in-run baseline, the greedy ``random`` fill on the same problem.  Writes
``benchmarks/out/bench_planner.json``.

    python benchmarks/bench_planner.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from snip.planner import Budget, solve
from snip.sensitivity import synthetic_table

FOUR = ("bf16", "mxfp8_e4m3", "mxfp4", "nvfp4")
SHAPES_70B = {"attention.wq": (8192, 8192), "attention.wk": (8192, 1024),
              "attention.wv": (8192, 1024), "attention.wo": (8192, 8192),
              "feed_forward.w1": (8192, 28672), "feed_forward.w2": (28672, 8192),
              "feed_forward.w3": (8192, 28672)}


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    table = synthetic_table(80, FOUR, seed=0, shapes=SHAPES_70B, tokens=4096)
    cases = {"fp4 >= 0.50": Budget(fp4_fraction=0.5), "fp4 >= 0.75": Budget(fp4_fraction=0.75),
             "fp4 >= 0.80": Budget(fp4_fraction=0.8),
             "time <= 0.40 (blackwell)": Budget(relative_time=0.4),
             "fp4 >= 0.5 and time <= 0.45": Budget(fp4_fraction=0.5, relative_time=0.45)}
    rows = []
    print(f"{'budget':<30} {'ILP s':>8} {'greedy s':>9} {'ratio':>6} {'ILP obj':>9} "
          f"{'greedy obj':>10}")
    for name, budget in cases.items():
        t_ilp, plan = timed(lambda b=budget: solve(table, b, per_gemm=True, candidates=FOUR),
                            args.repeat)
        t_gr, base = timed(lambda b=budget: solve(table, b, per_gemm=True, candidates=FOUR,
                                                  method="random"), args.repeat)
        rows.append({"budget": name, "ilp_seconds": t_ilp, "greedy_seconds": t_gr,
                     "ilp_objective": plan.meta["objective"],
                     "greedy_objective": base.meta["objective"],
                     "achieved": plan.meta["achieved"]})
        print(f"{name:<30} {t_ilp:8.3f} {t_gr:9.3f} {t_ilp / t_gr:6.1f} "
              f"{plan.meta['objective']:9.4f} {base.meta['objective']:10.4f}")
    out = Path(__file__).resolve().parent / "out" / "bench_planner.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"units": 80 * 7 * 3, "candidates": FOUR, "rows": rows}, indent=1))
    print(f"units: {80 * 7 * 3} (per GEMM) x {len(FOUR)} formats; wrote {out}")


if __name__ == "__main__":
    main()
