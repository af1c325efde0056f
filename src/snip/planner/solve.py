"""``solve`` / ``solution``: sensitivity table + budget -> a precision plan.

The one entry point behind the controller and ``snip plan``.  It builds the array problem
(:mod:`snip.planner.problem`), runs the ILP (:mod:`snip.planner.ilp`) or a baseline
(:mod:`snip.planner.baselines`, :mod:`snip.planner.oracle`), and writes the choice as a plan
that names every table layer exactly.

* :func:`solution` returns a typed :class:`Solution` (plan, what was achieved, objective,
  the matched target);
* :func:`solve` returns only the plan, with the same information in ``plan.meta``
  (``meta["achieved"]["fp4_flop_fraction"]``, ``meta["objective"]``, ``meta["match"]``).

Baselines (everything but ``ilp`` and ``uniform``) are held at the efficiency of a *reference*:
by default the ILP solved first on the same table, budget, candidates and granularity; pass
``reference=`` (another :class:`Solution`) or ``match=`` (an FP4 fraction) to hold them
elsewhere.  See :mod:`snip.planner.baselines` for the rule.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from snip.errors import UserError
from snip.formats import is_fp4
from snip.plan import PrecisionPlan
from snip.planner.baselines import (
    Method,
    Target,
    integer_weights,
    solve_baseline,
    target_of,
    target_of_fraction,
    top_units,
)
from snip.planner.ilp import solve_ilp
from snip.planner.oracle import Damage, min_cost_exact_sum, unit_key
from snip.planner.problem import Budget, Problem, build_problem, infeasible_message
from snip.sensitivity.table import GEMMS, SensitivityTable


@dataclass(frozen=True, kw_only=True)
class Achieved:
    """What a plan reaches on the table's layers (fractions relative to all-BF16 FLOPs/time)."""

    fp4_flop_fraction: float
    relative_gemm_time: float
    profile: str
    memory_bytes: float
    stage_fp4_flop_fractions: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        d = {"fp4_flop_fraction": self.fp4_flop_fraction,
             "relative_gemm_time": self.relative_gemm_time, "profile": self.profile,
             "memory_bytes": self.memory_bytes}
        if len(self.stage_fp4_flop_fractions) > 1:
            d["stage_fp4_flop_fractions"] = list(self.stage_fp4_flop_fractions)
        return d


@dataclass(frozen=True, kw_only=True)
class Solution:
    """A solved plan and its bookkeeping.

    ``objective`` is SNIP's objective (normalised loss + weight divergence from the table) of
    the plan, whatever method chose it, so methods compare on one scale.  ``target`` is the FP4
    fraction a baseline was held at (``None`` for ``ilp``/``uniform``) and ``exact`` whether it
    was hit exactly; ``damage`` is the oracle's summed measured damage.
    """

    plan: PrecisionPlan
    method: Method
    achieved: Achieved
    objective: float
    per_gemm: bool
    seed: int
    solve_seconds: float
    target: float | None = None
    exact: bool = True
    damage: float | None = None


def solution(table: SensitivityTable, budget: Budget | float, *, method: Method | str = "ilp",
             per_gemm: bool = False, candidates: Sequence[str] | None = None, seed: int = 0,
             reference: Solution | None = None, match: float | None = None,
             damage: Damage | None = None, top: int = 1) -> Solution:
    """The plan minimising normalised loss + weight divergence (``method="ilp"``), or a
    baseline's plan held at the ILP's FP4 fraction, under ``budget`` (a float is an FP4-FLOP
    fraction in [0, 1]).  ``method="oracle"`` needs ``damage`` (:func:`measure_damage`);
    ``top`` is how many of SNIP's most sensitive units ``random_top`` keeps high."""
    method = Method.parse(method)
    t0 = time.perf_counter()
    budget = Budget.of(budget)
    problem = build_problem(table, budget, candidates=candidates, per_gemm=per_gemm)
    if method is Method.ILP:
        return _finish(problem, solve_ilp(problem), method, per_gemm, seed, table.step, t0)
    if method is Method.UNIFORM:
        choice, _ = solve_baseline(problem, method, table, seed, Target((), True))
        return _finish(problem, choice, method, per_gemm, seed, table.step, t0)
    if match is not None:
        if reference is not None:
            raise UserError("pass either reference= (a Solution) or match= (an FP4 fraction), "
                             "not both")
        if not 0.0 <= match <= 1.0:
            raise UserError(f"match={match!r} must be an FP4 fraction in [0, 1]")
        if budget.fp4_fraction is None:
            raise UserError("match= is an FP4 fraction; it needs a budget with fp4_fraction")
        target = target_of_fraction(problem, match)
    else:
        ref_choice = solve_ilp(problem) if reference is None else \
            choice_of_plan(problem, reference.plan)
        target = target_of(problem, ref_choice)
    if method is Method.ORACLE:
        if damage is None:
            raise UserError("method='oracle' needs damage= (snip.planner.measure_damage: the "
                             "measured loss increase of each unit switched alone)")
        choice, exact, total = solve_oracle(table, problem, damage, target)
        return _finish(problem, choice, method, per_gemm, seed, table.step, t0,
                       target=target, exact=exact, damage=total)
    choice, exact = solve_baseline(problem, method, table, seed, target, top)
    sol = _finish(problem, choice, method, per_gemm, seed, table.step, t0, target=target,
                  exact=exact)
    if method is Method.RANDOM_TOP:
        keep = [unit_key(problem.units[u]) for u in top_units(problem, top)]
        sol = dataclasses.replace(sol, plan=sol.plan.with_meta(top_units=keep))
    return sol


def solve(table: SensitivityTable, budget: Budget | float, *, method: Method | str = "ilp",
          per_gemm: bool = False, candidates: Sequence[str] | None = None, seed: int = 0,
          reference: Solution | None = None, match: float | None = None,
          damage: Damage | None = None, top: int = 1) -> PrecisionPlan:
    """:func:`solution`'s plan (bookkeeping in ``plan.meta``)."""
    return solution(table, budget, method=method, per_gemm=per_gemm, candidates=candidates,
                    seed=seed, reference=reference, match=match, damage=damage, top=top).plan


def choice_of_plan(problem: Problem, plan: PrecisionPlan) -> np.ndarray:
    """A reference plan as a candidate index per unit of ``problem``: only its FP4 FLOPs and
    time are used, so a unit takes a 4-bit candidate when the plan has its GEMMs in 4 bits and
    the candidate closest in time otherwise (exact when the plan came from the same problem)."""
    index = {c: i for i, c in enumerate(problem.candidates)}
    fp4 = [i for i, c in enumerate(problem.candidates) if is_fp4(c)]
    other = [i for i in range(len(problem.candidates)) if i not in fp4]
    out = np.zeros(len(problem.units), dtype=int)
    for u, (name, gemms) in enumerate(problem.units):
        entry = plan.layers.get(name)
        if entry is None:
            raise UserError(f"reference plan does not name layer {name!r}")
        names = {entry[g] for g in gemms}
        if len(names) == 1 and next(iter(names)) in index:
            out[u] = index[next(iter(names))]
        else:
            four = sum(is_fp4(entry[g]) for g in gemms) * 2 > len(gemms)
            pool = (fp4 if four else other) or list(range(len(problem.candidates)))
            out[u] = pool[0]
    return out


def solve_oracle(table: SensitivityTable, problem: Problem, damage: Damage,
                 target: Target) -> tuple[np.ndarray, bool, float]:
    """Per stage, the least total measured damage among unit sets with FP4 FLOPs equal to the
    target (the smallest reachable amount above it when none is equal)."""
    for c in (damage.high, damage.low):
        if c not in problem.candidates:
            raise UserError(f"the damage table was measured for {damage.high} -> {damage.low} "
                             f"but {c!r} is not a plan candidate ({', '.join(problem.candidates)})")
    if not is_fp4(damage.low) and problem.budget.fp4_fraction is not None:
        raise UserError(f"the damage table's low format {damage.low!r} is not 4-bit; an FP4 "
                         f"budget needs damage measured for a 4-bit candidate")
    hi, lo = problem.candidates.index(damage.high), problem.candidates.index(damage.low)
    cost = np.array([damage.of(u) for u in problem.units])
    choice = np.full(len(problem.units), hi)
    exact = True
    for s in range(problem.n_stages):
        rows = np.flatnonzero(problem.stage == s)
        iw = integer_weights(problem.flops[rows])
        if iw is None:
            raise UserError("the oracle needs integral layer FLOPs (tokens x shapes)")
        w, g = iw
        need = int(np.ceil(target.flops[s] / g - 1e-9))
        y = None
        for t in range(need, need + int(w.max()) + 1):
            y = min_cost_exact_sum(cost[rows], w, t)
            if y is not None:
                exact &= t * g == round(target.flops[s])
                break
        if y is None:
            raise UserError(infeasible_message(problem))
        choice[rows[y]] = lo
    if problem.violations(choice):
        raise UserError(infeasible_message(problem) + " (oracle: high/low formats only)")
    return choice, exact, float(cost[choice == lo].sum())


def choice_table(problem: Problem, choice: np.ndarray) -> dict[str, dict[str, str]]:
    """``{layer: {gemm: preset}}`` for a choice vector."""
    out: dict[str, dict[str, str]] = {}
    for (name, gemms), p in zip(problem.units, choice, strict=True):
        for g in gemms:
            out.setdefault(name, {})[g] = problem.candidates[int(p)]
    return {n: {g: out[n][g] for g in GEMMS} for n in out}


def achieved_of(problem: Problem, choice: np.ndarray) -> Achieved:
    stages = tuple(problem.fp4_fraction(choice, problem.stage == s)
                   for s in range(problem.n_stages))
    return Achieved(fp4_flop_fraction=problem.fp4_fraction(choice),
                    relative_gemm_time=problem.relative_time(choice),
                    profile=problem.budget.profile.name, memory_bytes=problem.memory(choice),
                    stage_fp4_flop_fractions=stages)


def _finish(problem: Problem, choice: np.ndarray, method: Method, per_gemm: bool, seed: int,
            step: int | None, t0: float, *, target: Target | None = None, exact: bool = True,
            damage: float | None = None) -> Solution:
    achieved = achieved_of(problem, choice)
    target_frac = None
    if target is not None:
        total = problem.total_flops or 1.0
        target_frac = float(sum(target.flops) / total) if target.exact else None
    seconds = time.perf_counter() - t0
    plan = to_plan(problem, choice, method=method, per_gemm=per_gemm, step=step,
                   solve_seconds=seconds)
    extra: dict = {"seed": seed} if method in (Method.RANDOM, Method.RANDOM_TOP) else {}
    if target is not None:
        extra["match"] = {"target_fp4_flop_fraction": target_frac, "exact": exact}
    if damage is not None:
        extra["oracle_damage"] = damage
    if extra:
        plan = plan.with_meta(**extra)
    return Solution(plan=plan, method=method, achieved=achieved,
                    objective=problem.objective(choice), per_gemm=per_gemm, seed=seed,
                    solve_seconds=seconds, target=target_frac, exact=exact, damage=damage)


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
            "achieved": achieved_of(problem, choice).to_dict(),
            "objective": problem.objective(choice), "solve_seconds": solve_seconds}
    if step is not None:
        meta["step"] = step
    return PrecisionPlan(default=dict.fromkeys(GEMMS, default), layers=layers, meta=meta)
