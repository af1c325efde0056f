"""SNIP's precision ILP (paper section 5), solved with ``scipy.optimize.milp`` (HiGHS).

Variables ``x[u, p] in {0, 1}``: unit ``u`` (a layer, or one GEMM of a layer) runs in candidate
format ``p``.  With ``c[u, p]`` the normalised loss + weight divergence and ``F_u`` the unit's
FLOPs::

    minimise    sum_{u,p} c[u,p] x[u,p]
    subject to  sum_p x[u,p] = 1                                    for every unit u
                sum_{u in S, p 4-bit} F_u x[u,p] >= r sum_{u in S} F_u    for every stage S
                sum_{u in S, p} F_u / s_p x[u,p] <= t sum_{u in S} F_u    (time budget, optional)
                sum_{u,p} bytes[u,p] x[u,p] <= M                         (memory cap, optional)

``S`` is the whole model unless pipeline stages are given (one slow stage would otherwise erase
the gain elsewhere).  This is a multiple-choice knapsack; its LP relaxation has at most a few
fractional units per constraint, so HiGHS closes it in milliseconds even for a 70B model planned
per GEMM (1680 units x 4 formats, ``benchmarks/bench_planner.py``).

:func:`solve_brute_force` enumerates every assignment; tests check the two agree.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, csr_matrix

from snip.planner.problem import Problem, infeasible_message

_TIGHTEN = (0.0, 1e-9, 1e-7, 1e-5)  # rhs margins tried when HiGHS' tolerance lands just outside


def _budget_rows(p: Problem, margin: float) -> list[LinearConstraint]:
    """One row per stage per budget kind, normalised so coefficients are O(1)."""
    n, k = p.cost.shape
    b, rows = p.budget, []
    for s in range(p.n_stages):
        in_s = (p.stage == s)[:, None].astype(float)
        tot = float(p.flops[p.stage == s].sum()) or 1.0
        if b.fp4_fraction is not None and b.fp4_fraction > 0:
            coef = (p.fp4 * in_s / tot).ravel()
            rows.append(LinearConstraint(csr_matrix(coef), b.fp4_fraction + margin, np.inf))
        if b.relative_time is not None:
            coef = (p.time * in_s / tot).ravel()
            rows.append(LinearConstraint(csr_matrix(coef), -np.inf, b.relative_time - margin))
    if b.memory_bytes is not None:
        coef = (p.mem / b.memory_bytes).ravel()
        rows.append(LinearConstraint(csr_matrix(coef), -np.inf, 1.0 - margin))
    return rows


def _one_per_unit(n: int, k: int) -> LinearConstraint:
    r = np.repeat(np.arange(n), k)
    a = coo_matrix((np.ones(n * k), (r, np.arange(n * k))), shape=(n, n * k)).tocsr()
    return LinearConstraint(a, 1.0, 1.0)


def solve_ilp(problem: Problem, *, time_limit: float = 60.0) -> np.ndarray:
    """Optimal candidate index per unit; ``ValueError`` when the budget cannot be met."""
    n, k = problem.cost.shape
    if problem.violations(problem.fp4.argmax(1)) and problem.budget.fp4_fraction is not None \
            and problem.budget.relative_time is None and problem.budget.memory_bytes is None:
        raise ValueError(infeasible_message(problem))  # fast path: even all-FP4 falls short
    # Ties between formats of equal cost go to the earlier candidate (a tiny lexicographic
    # nudge, far below any real divergence difference).
    nudge = 1e-12 * (1.0 + np.abs(problem.cost).max()) * np.arange(k)[None, :]
    c = (problem.cost + nudge).ravel()
    for margin in _TIGHTEN:
        res = milp(c, integrality=np.ones(n * k), bounds=Bounds(0, 1),
                   constraints=[_one_per_unit(n, k), *_budget_rows(problem, margin)],
                   options={"time_limit": time_limit, "mip_rel_gap": 1e-9})
        if res.x is None:
            raise ValueError(infeasible_message(problem))
        choice = res.x.reshape(n, k).argmax(1)
        if not problem.violations(choice):
            return choice
    raise ValueError(infeasible_message(problem))


def solve_brute_force(problem: Problem) -> np.ndarray:
    """Exhaustive reference for tiny problems (``k ** n`` assignments)."""
    n, k = problem.cost.shape
    if k**n > 2_000_000:
        raise ValueError(f"brute force over {k}^{n} assignments is too large; use solve_ilp")
    best, best_cost = None, np.inf
    for combo in itertools.product(range(k), repeat=n):
        choice = np.array(combo)
        cost = problem.objective(choice)
        if cost < best_cost - 1e-12 and not problem.violations(choice):
            best, best_cost = choice, cost
    if best is None:
        raise ValueError(infeasible_message(problem))
    return best
