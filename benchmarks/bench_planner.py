"""Planner solve time on a Llama-2-70B-shaped problem (target: < 1 s per solve), and baselines
held at the ILP's FP4 fraction.

80 blocks x 7 linear layers, real 70B shapes (dim 8192, GQA kv 1024, ffn 28672), 4 candidate
formats (bf16, mxfp8_e4m3, mxfp4, nvfp4), decided per GEMM: 1680 units x 4 formats = 6720
binaries (``--per-layer``: 560 units).  For each budget it times ``snip.planner.solution``
(problem build + solve + plan construction) for the ILP and for the ``layer_type`` baseline
(which solves the ILP first and then matches its FP4 fraction), names the path the ILP took
(``dp``: an exact knapsack DP; ``core``: FP4 + time budgets, Lagrangian reduced-cost fixing
and a small exact MILP on the remaining core, :func:`snip.planner.ilp._solve_core`; ``milp``:
HiGHS on the whole problem), and checks that ``layer_type``,
``min_rel_err``, ``layer_id`` and 5 ``random`` draws all land on exactly the ILP's FP4
fraction (FP4 budgets; time budgets: within one unit's time).  Writes
``benchmarks/out/bench_planner.json``.

    python benchmarks/bench_planner.py [--repeat 3] [--per-layer]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from snip.planner import Budget, build_problem, solution
from snip.planner.ilp import (
    _Columns,
    _knapsack_weights,
    _solve_core,
    _solve_dp,
    dominated,
    solve_ilp,
    solve_milp_only,
)
from snip.sensitivity import synthetic_table

FOUR = ("bf16", "mxfp8_e4m3", "mxfp4", "nvfp4")
SHAPES_70B = {"attention.wq": (8192, 8192), "attention.wk": (8192, 1024),
              "attention.wv": (8192, 1024), "attention.wo": (8192, 8192),
              "feed_forward.w1": (8192, 28672), "feed_forward.w2": (28672, 8192),
              "feed_forward.w3": (8192, 28672)}
CASES = {"fp4 >= 0.50": Budget(fp4_fraction=0.5), "fp4 >= 0.75": Budget(fp4_fraction=0.75),
         "fp4 >= 0.80": Budget(fp4_fraction=0.8),
         "time <= 0.40 (blackwell)": Budget(relative_time=0.4),
         "time <= 0.60 (blackwell)": Budget(relative_time=0.6),
         "time <= 0.40 (blackwell_ultra)": Budget(relative_time=0.4, profile="blackwell_ultra"),
         "fp4 >= 0.5 and time <= 0.45": Budget(fp4_fraction=0.5, relative_time=0.45),
         "fp4 >= 0.75 and time <= 0.45": Budget(fp4_fraction=0.75, relative_time=0.45),
         "fp4 >= 0.6 and time <= 0.40": Budget(fp4_fraction=0.6, relative_time=0.4)}


CPU_SECONDS: list[float] = []  # process CPU time of the last timed() call's runs


def timed(fn, repeat: int) -> tuple[float, object]:
    """Median wall seconds of ``repeat`` calls (median CPU seconds go to ``CPU_SECONDS``: on a
    shared machine at high load, CPU time is the fairer before/after comparison)."""
    times, cpu, out = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    CPU_SECONDS[:] = [statistics.median(cpu)]
    return statistics.median(times), out


def ilp_path(table, budget: Budget, per_gemm: bool) -> str:
    p = build_problem(table, budget, candidates=FOUR, per_gemm=per_gemm)
    if budget.relative_time is not None and budget.fp4_fraction is not None:
        keep = ~dominated(p)
        keep[np.arange(len(keep)), keep.argmax(1)] = True
        return "core" if _solve_core(p, keep, p.cost, 60.0) is not None else "milp"
    if budget.relative_time is not None:
        return "dp" if _solve_dp(p) is not None else "milp"
    return "dp" if _knapsack_weights(p, _Columns.of(p)) is not None else "milp"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--per-layer", action="store_true", help="one format per layer")
    args = ap.parse_args()
    per_gemm = not args.per_layer
    table = synthetic_table(80, FOUR, seed=0, shapes=SHAPES_70B, tokens=4096)
    rows = []
    print(f"{'budget':<32} {'path':>5} {'ILP s':>7} {'layer_type s':>12} {'ILP fp4':>8} "
          f"{'matched':>8} {'ILP obj':>8} {'layer_type obj':>14}")
    for name, budget in CASES.items():
        kw = {"per_gemm": per_gemm, "candidates": FOUR}
        t_ilp, ilp = timed(lambda b=budget, kw=kw: solution(table, b, **kw), args.repeat)
        cpu_ilp = CPU_SECONDS[0]
        milp = {}
        if budget.relative_time is not None and budget.fp4_fraction is not None:
            # the previous path for combined budgets: HiGHS on the whole problem
            prob = build_problem(table, budget, candidates=FOUR, per_gemm=per_gemm)
            t_m, ch = timed(lambda prob=prob: solve_milp_only(prob), args.repeat)
            milp = {"milp_seconds": t_m, "milp_cpu_seconds": CPU_SECONDS[0],
                    "milp_objective": prob.objective(ch),
                    "core_objective": prob.objective(solve_ilp(prob))}
        t_lt, lt = timed(lambda b=budget, kw=kw: solution(table, b, method="layer_type", **kw),
                         args.repeat)
        others = [solution(table, budget, method=m, seed=s, reference=ilp, **kw)
                  for m, seeds in (("layer_type", [0]), ("min_rel_err", [0]), ("layer_id", [0]),
                                   ("random", range(5))) for s in seeds]
        if budget.fp4_fraction is not None:
            matched = sum(abs(o.achieved.fp4_flop_fraction - ilp.achieved.fp4_flop_fraction)
                          < 1e-12 for o in others)
        else:
            matched = sum(o.achieved.relative_gemm_time <= ilp.achieved.relative_gemm_time + 1e-12
                          for o in others)
        path = ilp_path(table, budget, per_gemm)
        rows.append({"budget": name, "path": path, "ilp_seconds": t_ilp,
                     "ilp_cpu_seconds": cpu_ilp, **milp,
                     "layer_type_seconds": t_lt, "ilp_objective": ilp.objective,
                     "layer_type_objective": lt.objective,
                     "ilp_achieved": ilp.achieved.to_dict(),
                     "matched": f"{matched}/{len(others)}"})
        print(f"{name:<32} {path:>5} {t_ilp:7.3f} {t_lt:12.3f} "
              f"{ilp.achieved.fp4_flop_fraction:8.4f} {matched:>5}/{len(others):<2} "
              f"{ilp.objective:8.4f} {lt.objective:14.4f}  cpu {cpu_ilp:.3f}s"
              + (f"; whole-problem MILP {milp['milp_seconds']:.3f}s (cpu "
                 f"{milp['milp_cpu_seconds']:.3f}s, objective {milp['milp_objective']:.9f} vs "
                 f"{milp['core_objective']:.9f})" if milp else ""))
    units = 80 * 7 * (3 if per_gemm else 1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _util import cpu_info
    out = Path(__file__).resolve().parent / "out" / "bench_planner.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"units": units, "per_gemm": per_gemm, "candidates": FOUR,
                               "cpu": platform.processor() or platform.machine(),
                               "cpu_info": cpu_info(), "load_average": os.getloadavg(),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "rows": rows}, indent=1))
    print(f"units: {units} x {len(FOUR)} formats; wrote {out}")


if __name__ == "__main__":
    main()
