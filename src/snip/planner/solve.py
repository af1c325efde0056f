"""``solve``: sensitivity table + budget -> :class:`~snip.plan.PrecisionPlan`.

The one entry point behind the controller and ``snip plan``.  It builds the array problem
(:mod:`snip.planner.problem`), runs the ILP (:mod:`snip.planner.ilp`) or a baseline
(:mod:`snip.planner.baselines`), and writes the choice as a plan that names every table layer
exactly, with what was achieved in ``meta``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from snip.plan import PrecisionPlan
from snip.planner.baselines import Method, solve_baseline
from snip.planner.ilp import solve_ilp
from snip.planner.problem import Budget, Problem, build_problem
from snip.sensitivity.table import GEMMS, SensitivityTable


def solve(table: SensitivityTable, budget: Budget | float, *, method: Method | str = "ilp",
          per_gemm: bool = False, candidates: Sequence[str] | None = None,
          seed: int = 0) -> PrecisionPlan:
    """The plan minimising normalised loss + weight divergence (``method="ilp"``), or a
    baseline's plan, under ``budget`` (a float is an FP4-FLOP fraction in [0, 1])."""
    method = Method.parse(method)
    t0 = time.perf_counter()
    problem = build_problem(table, Budget.of(budget), candidates=candidates, per_gemm=per_gemm)
    if method is Method.ILP:
        choice = solve_ilp(problem)
    else:
        choice = solve_baseline(problem, method, table, seed)
    return to_plan(problem, choice, method=method, per_gemm=per_gemm, step=table.step,
                   solve_seconds=time.perf_counter() - t0)


def choice_table(problem: Problem, choice: np.ndarray) -> dict[str, dict[str, str]]:
    """``{layer: {gemm: preset}}`` for a choice vector."""
    out: dict[str, dict[str, str]] = {}
    for (name, gemms), p in zip(problem.units, choice, strict=True):
        for g in gemms:
            out.setdefault(name, {})[g] = problem.candidates[int(p)]
    return {n: {g: out[n][g] for g in GEMMS} for n in out}


def to_plan(problem: Problem, choice: np.ndarray, *, method: Method, per_gemm: bool,
            step: int | None = None, solve_seconds: float = 0.0) -> PrecisionPlan:
    layers = choice_table(problem, choice)
    counts: dict[str, int] = {}
    for entry in layers.values():
        for c in entry.values():
            counts[c] = counts.get(c, 0) + 1
    default = max(counts, key=counts.get)
    meta = {"budget": problem.budget.describe(), "method": method.value, "per_gemm": per_gemm,
            "candidates": list(problem.candidates),
            "achieved": {"fp4_flop_fraction": problem.fp4_fraction(choice),
                         "relative_gemm_time": problem.relative_time(choice),
                         "profile": problem.budget.profile.name,
                         "memory_bytes": problem.memory(choice)},
            "objective": problem.objective(choice), "solve_seconds": solve_seconds}
    if step is not None:
        meta["step"] = step
    return PrecisionPlan(default=dict.fromkeys(GEMMS, default), layers=layers, meta=meta)
