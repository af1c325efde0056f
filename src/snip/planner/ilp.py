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
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix, csr_matrix

from snip.errors import UserError
from snip.planner.problem import Problem, infeasible_message

_TIGHTEN = (0.0, 1e-9, 1e-7, 1e-5)  # rhs margins tried when HiGHS' tolerance lands just outside


@dataclass(frozen=True)
class _Columns:
    """The compact MILP: unit ``u`` starts in its ``base`` candidate; binary ``y_j`` moves
    unit ``unit[j]`` to candidate ``cand[j]`` (at most one move per unit).  Dominated
    candidates get no column, so an FP4-only budget becomes a plain 0/1 knapsack."""

    base: np.ndarray
    unit: np.ndarray
    cand: np.ndarray

    @classmethod
    def of(cls, problem: Problem) -> _Columns:
        keep = ~dominated(problem)
        base = keep.argmax(1)
        move = keep.copy()
        move[np.arange(len(base)), base] = False
        unit, cand = np.nonzero(move)
        return cls(base, unit, cand)

    def delta(self, a: np.ndarray) -> np.ndarray:
        """Change of the per-(unit, candidate) quantity ``a`` for each move."""
        return a[self.unit, self.cand] - a[self.unit, self.base[self.unit]]

    def base_sum(self, a: np.ndarray, rows: np.ndarray | None = None) -> float:
        vals = a[np.arange(len(self.base)), self.base]
        return float(vals.sum() if rows is None else vals[rows].sum())

    def choice(self, y: np.ndarray) -> np.ndarray:
        out = self.base.copy()
        on = np.round(y) > 0.5
        out[self.unit[on]] = self.cand[on]
        return out


def _budget_rows(p: Problem, cols: _Columns, margin: float) -> list[LinearConstraint]:
    """Budget rows over the moves, normalised so coefficients are O(1)."""
    b, rows = p.budget, []
    for s in range(p.n_stages):
        in_s = (p.stage == s)
        tot = float(p.flops[in_s].sum()) or 1.0
        sel = in_s[cols.unit].astype(float)
        if b.fp4_fraction:
            rhs = b.fp4_fraction + margin - cols.base_sum(p.fp4, in_s) / tot
            rows.append(LinearConstraint(csr_matrix(sel * cols.delta(p.fp4) / tot), rhs, np.inf))
        if b.relative_time is not None:
            rhs = b.relative_time - margin - cols.base_sum(p.time, in_s) / tot
            rows.append(LinearConstraint(csr_matrix(sel * cols.delta(p.time) / tot), -np.inf, rhs))
    if b.memory_bytes is not None:
        rhs = 1.0 - margin - cols.base_sum(p.mem) / b.memory_bytes
        rows.append(LinearConstraint(csr_matrix(cols.delta(p.mem) / b.memory_bytes), -np.inf, rhs))
    return rows


def _at_most_one_move(cols: _Columns) -> list[LinearConstraint]:
    units, counts = np.unique(cols.unit, return_counts=True)
    multi = units[counts > 1]
    if not len(multi):
        return []
    row_of = {int(u): i for i, u in enumerate(multi)}
    js = [j for j, u in enumerate(cols.unit) if int(u) in row_of]
    a = coo_matrix((np.ones(len(js)), ([row_of[int(cols.unit[j])] for j in js], js)),
                   shape=(len(multi), len(cols.unit))).tocsr()
    return [LinearConstraint(a, 0.0, 1.0)]


def dominated(problem: Problem) -> np.ndarray:
    """Mask of ``(unit, candidate)`` pairs no optimal plan needs.

    ``p`` is dominated for unit ``u`` when another candidate ``q`` is no worse on the objective
    and on every active budget resource (more FP4 FLOPs, less time, fewer bytes) -- strictly
    better on one, or equal everywhere and earlier in the list.  Swapping ``p`` for ``q`` keeps
    any plan feasible and no worse, so fixing ``x[u, p] = 0`` loses nothing.  With only an FP4
    target this leaves two options per unit (the best 4-bit and the best other format) and
    HiGHS solves a plain 0/1 knapsack.
    """
    b = problem.budget
    keys = [problem.cost]  # all oriented "smaller is better"
    if b.fp4_fraction:
        keys.append(-problem.fp4)
    if b.relative_time is not None:
        keys.append(problem.time)
    if b.memory_bytes is not None:
        keys.append(problem.mem)
    v = np.stack(keys, axis=-1)  # (n, k, r)
    n, k, _ = v.shape
    out = np.zeros((n, k), dtype=bool)
    for p_ in range(k):
        for q in range(k):
            if q == p_:
                continue
            le = (v[:, q] <= v[:, p_]).all(-1)
            lt = (v[:, q] < v[:, p_]).any(-1)
            out[:, p_] |= le & (lt | (q < p_))
    return out


_DP_MAX_CELLS = 100_000_000  # units x capacity of the knapsack table (bytes of backtracking)


def _knapsack_weights(problem: Problem, cols: _Columns) -> tuple[np.ndarray, int] | None:
    """Integer FP4-FLOP gains of the moves (in units of their gcd) and the integer target, when
    the problem is a single-constraint 0/1 knapsack small enough for the exact DP."""
    b = problem.budget
    if b.relative_time is not None or b.memory_bytes is not None or problem.n_stages > 1:
        return None
    if not b.fp4_fraction or len(np.unique(cols.unit)) != len(cols.unit):
        return None  # nothing to meet, or some unit keeps two alternatives
    gain = cols.delta(problem.fp4)
    flops = problem.flops
    if np.any(gain <= 0) or np.any(flops != np.round(flops)) or flops.max() > 2**62:
        return None
    g = int(np.gcd.reduce(np.round(flops).astype(np.int64)))
    w = np.round(gain).astype(np.int64) // g
    total = int(np.round(flops.sum())) // g
    need = int(np.ceil(b.fp4_fraction * total - 1e-9)) - int(
        np.round(cols.base_sum(problem.fp4))) // g
    if len(w) * (max(need, 0) + 1) > _DP_MAX_CELLS:
        return None
    return w, need


def _solve_knapsack_dp(c: np.ndarray, w: np.ndarray, need: int) -> np.ndarray | None:
    """Exact ``min c.y  s.t.  w.y >= need``, ``y`` binary (``None``: infeasible).

    Moves that lower the cost are taken up front (they also help the constraint); the rest go
    through ``best[k] = min cost of reaching at least k``, capped at ``need``.
    """
    y = (c < 0).astype(bool)
    need -= int(w[y].sum())
    if need <= 0:
        return y
    idx = np.flatnonzero(~y)
    best = np.full(need + 1, np.inf)
    best[0] = 0.0
    take = np.zeros((len(idx), need + 1), dtype=bool)
    ks = np.arange(need + 1)
    for row, j in enumerate(idx):
        cand = best[np.maximum(ks - w[j], 0)] + c[j]
        better = cand < best
        take[row] = better
        best = np.where(better, cand, best)
    if not np.isfinite(best[need]):
        return None
    k = need
    for row in range(len(idx) - 1, -1, -1):
        if take[row, k]:
            y[idx[row]] = True
            k = max(k - int(w[idx[row]]), 0)
    return y


def solve_mckp_dp(cost: np.ndarray, weight: np.ndarray, allowed: np.ndarray,
                  cap: int) -> np.ndarray | None:
    """Exact multiple-choice knapsack with one resource: ``argmin sum_u cost[u, p_u]`` subject
    to ``sum_u weight[u, p_u] <= cap`` over the ``allowed`` options (``None``: infeasible).

    Each unit's lightest option is taken as its base, so the table only spans the *extra*
    weight ``cap - sum_u min_p weight[u, p]``; ``best[c]`` is the least cost with at most ``c``
    extra, one ``uint8`` argmin row per unit is kept for backtracking.
    """
    n, k = cost.shape
    w = np.where(allowed, weight, np.iinfo(np.int64).max // 4)
    base = w.min(1)
    room = int(cap - base.sum())
    if room < 0:
        return None
    extra = w - base[:, None]
    # arg[u, c] is the rank of the option chosen (0 = the unit's lightest), in ``ranked[u]``
    ranked = [sorted((int(extra[u, p]), p) for p in range(k) if allowed[u, p]
                     and extra[u, p] <= room) for u in range(n)]
    # Units go lightest-first; after a prefix, no selection uses more than ``hi`` extra, and
    # best[c] == best[hi] above it, so only [0, hi] is computed (about half the table).
    seq = sorted(range(n), key=lambda u: ranked[u][-1][0])
    best, new = np.zeros(room + 1), np.empty(room + 1)
    tmp, mask = np.empty(room + 1), np.empty(room + 1, dtype=bool)
    arg = np.zeros((n, room + 1), dtype=np.uint8)
    his = np.zeros(n, dtype=np.int64)
    hi = 0
    for u in seq:
        opts = ranked[u]
        top = min(room, hi + opts[-1][0])
        best[hi + 1:top + 1] = best[hi]  # extend the constant tail
        np.add(best[:top + 1], cost[u, opts[0][1]], out=new[:top + 1])  # opts[0][0] == 0
        for r, (e, p) in enumerate(opts[1:], start=1):
            m = top + 1 - e
            np.add(best[:m], cost[u, p], out=tmp[:m])
            np.less(tmp[:m], new[e:top + 1], out=mask[:m])
            np.copyto(new[e:top + 1], tmp[:m], where=mask[:m])
            np.copyto(arg[u, e:top + 1], r, where=mask[:m])
        best, new = new, best
        hi = his[u] = top
    choice = np.zeros(n, dtype=int)
    c = room
    for u in reversed(seq):
        c = min(c, int(his[u]))
        e, p = ranked[u][int(arg[u, c])]
        choice[u] = p
        c -= e
    return choice


def _time_scale(problem: Problem) -> int | None:
    """Smallest integer ``L`` making every candidate's ``L / speed`` integral (``None``: none
    up to 720, e.g. irrational speeds)."""
    speeds = [problem.budget.profile.speed(c) for c in problem.candidates]
    for scale in range(1, 721):
        if all(abs(scale / s - round(scale / s)) < 1e-9 for s in speeds):
            return scale
    return None


def _resource_dp(problem: Problem, allowed: np.ndarray, resource: str) -> np.ndarray | None:
    """Exact DP over one budget resource (``"time"`` or ``"fp4"``), ignoring the others and
    stages > 1 handled stage by stage; ``None`` when the integer table would be too large."""
    b = problem.budget
    flops = problem.flops
    if not len(flops) or np.any(flops != np.round(flops)) or flops.max() > 2**62:
        return None
    g = int(np.gcd.reduce(np.round(flops).astype(np.int64)))
    units = np.round(flops).astype(np.int64) // g
    if resource == "time":
        scale = _time_scale(problem)
        if scale is None:
            return None
        speeds = np.array([b.profile.speed(c) for c in problem.candidates])
        weight = units[:, None] * np.round(scale / speeds).astype(np.int64)[None, :]
    else:  # FP4 deficit: FLOPs not in a 4-bit format, at most (1 - r) of the total
        scale = 1
        fp4 = np.round(problem.fp4 / g).astype(np.int64)
        weight = units[:, None] - fp4
    choice = np.zeros(len(units), dtype=int)
    for s in range(problem.n_stages):
        rows = np.flatnonzero(problem.stage == s)
        total = int(units[rows].sum()) * scale
        if resource == "time":
            cap = int(np.floor(b.relative_time * total + 1e-9 * max(total, 1)))
        else:
            cap = int(np.floor((1.0 - b.fp4_fraction) * total + 1e-9 * max(total, 1)))
        room = cap - int(np.where(allowed[rows], weight[rows], 2**60).min(1).sum())
        if room >= 0 and len(rows) * (room + 1) > _DP_MAX_CELLS:
            return None
        got = solve_mckp_dp(problem.cost[rows], weight[rows], allowed[rows], cap)
        if got is None:
            raise UserError(infeasible_message(problem))
        choice[rows] = got
    return choice


def _slack_first(problem: Problem) -> list[str]:
    """For an FP4 + time budget: the resources worth a relaxation DP, most promising first.

    The LP relaxation (milliseconds) tells which constraints bind: dropping one with a zero
    dual is likely to leave the other's DP optimum feasible; when both duals are non-zero both
    relaxations almost surely fail, so none is tried (only a speed heuristic: any DP answer is
    still verified against both constraints)."""
    cols = _Columns.of(problem)
    if not len(cols.unit):
        return ["time", "fp4"]
    blocks, b_ub, kinds = [], [], []
    for row in _at_most_one_move(cols):  # y >= 0 already: only the upper side
        blocks.append(row.A)
        b_ub.append(np.broadcast_to(row.ub, row.A.shape[0]))
        kinds += ["move"] * row.A.shape[0]
    for row in _budget_rows(problem, cols, 0.0):  # one row each: >= is fp4, <= is time
        fp4 = np.isfinite(row.lb).all()
        blocks.append(-row.A if fp4 else row.A)
        b_ub.append(np.atleast_1d(-row.lb if fp4 else row.ub).astype(float))
        kinds.append("fp4" if fp4 else "time")
    from scipy.optimize import linprog
    from scipy.sparse import vstack

    res = linprog(cols.delta(problem.cost), A_ub=vstack(blocks).tocsr(),
                  b_ub=np.concatenate(b_ub),
                  bounds=(0, 1), method="highs")
    if res.status != 0:
        return ["time", "fp4"]
    duals = np.abs(res.ineqlin.marginals)
    tight = {r: bool(np.any(duals[np.array(kinds) == r] > 1e-12)) for r in ("time", "fp4")}
    if tight["time"] and tight["fp4"]:
        return []
    # drop the slack constraint: solve the DP of the binding one first
    return ["fp4", "time"] if tight["fp4"] else ["time", "fp4"]


def _solve_dp(problem: Problem) -> np.ndarray | None:
    """The exact DP paths for time and combined FP4 + time budgets (no memory cap).

    A time-only budget is one multiple-choice knapsack per stage.  With both an FP4 target and
    a time limit, each constraint is dropped in turn and the other solved exactly: an optimum
    of the relaxation that also meets the dropped constraint is optimal for both.  When both
    constraints bind, ``None`` (the MILP decides)."""
    b = problem.budget
    if b.memory_bytes is not None or b.relative_time is None:
        return None
    keep = ~dominated(problem)
    keep[np.arange(len(keep)), keep.argmax(1)] = True
    resources = ["time"] if b.fp4_fraction is None else _slack_first(problem)
    for resource in resources:
        choice = _resource_dp(problem, keep, resource)
        if choice is not None and not problem.violations(choice):
            return choice
    return None


def _budget_matrix(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """FP4 and time budget rows in ``<=`` form per stage: ``A[r] (n, k)`` and ``b[r]``,
    normalised by the stage's FLOPs (FP4 rows negated)."""
    b, rows, rhs = problem.budget, [], []
    for s in range(problem.n_stages):
        in_s = (problem.stage == s)[:, None]
        tot = float(problem.flops[in_s[:, 0]].sum()) or 1.0
        if b.fp4_fraction:
            rows.append(-problem.fp4 * in_s / tot)
            rhs.append(-b.fp4_fraction)
        if b.relative_time is not None:
            rows.append(problem.time * in_s / tot)
            rhs.append(b.relative_time)
    return np.array(rows), np.array(rhs)


def _best_rounding(problem: Problem, x: np.ndarray, allowed: np.ndarray,
                   cost: np.ndarray) -> np.ndarray | None:
    """The cheapest feasible plan that keeps the LP's integral units and tries every option of
    its (few) fractional ones; ``None`` if there is none."""
    choice = x.argmax(1)
    frac = np.flatnonzero(x.max(1) < 1 - 1e-7)
    if len(frac) > 4:
        return None
    best, best_cost = None, np.inf
    for combo in itertools.product(*[np.flatnonzero(allowed[u]) for u in frac]):
        choice[frac] = combo
        c = float(cost[np.arange(len(choice)), choice].sum())
        if c < best_cost and not problem.violations(choice):
            best, best_cost = choice.copy(), c
    return best


def _solve_core(problem: Problem, allowed: np.ndarray, cost: np.ndarray,
                time_limit: float) -> np.ndarray | None:
    """Exact FP4 + time (+ stages) plans by Lagrangian reduced-cost fixing and a small MILP.

    1. The LP relaxation (HiGHS simplex, milliseconds) gives multipliers ``mu >= 0`` of the
       budget rows ``A x <= b``.  For *any* feasible plan ``x``::

           cost(x) >= cost(x) + mu.(A x - b) = L(mu) + sum_u rc[u, x_u]

       with the Lagrangian costs ``c'[u,p] = cost[u,p] + mu.A[:, u, p]``, the bound
       ``L(mu) = sum_u min_p c'[u,p] - mu.b`` and reduced costs ``rc = c' - min_p c'``.
    2. Rounding the LP's few fractional units gives a feasible incumbent of cost ``UB``.
    3. An optimal plan has ``sum_u rc[u, x_u] <= UB - L``, so every option with
       ``rc[u,p] > UB - L`` can be removed: most units keep only their Lagrangian best option.
    4. The remaining *core* (units with >= 2 options left) is a small MILP with the residual
       budgets; its optimum together with the fixed units is optimal for the whole problem.
       The core is grown from a small threshold ``g`` instead of ``UB - L`` at once: a
       restricted optimum of cost ``c`` with ``c - L <= g`` is already certified optimal.

    ``None`` when the LP fails or no rounding is feasible (the caller runs the full MILP)."""
    from scipy.optimize import linprog

    n, k = cost.shape
    A, rhs = _budget_matrix(problem)
    uu, pp = np.nonzero(allowed)
    a_eq = coo_matrix((np.ones(len(uu)), (uu, np.arange(len(uu)))), shape=(n, len(uu))).tocsr()
    res = linprog(cost[uu, pp], A_ub=A[:, uu, pp], b_ub=rhs, A_eq=a_eq, b_eq=np.ones(n),
                  bounds=(0, 1), method="highs-ds")
    if res.status != 0:
        return None
    mu = np.maximum(-res.ineqlin.marginals, 0.0)
    lag = np.where(allowed, cost + np.tensordot(mu, A, axes=1), np.inf)
    low = lag.min(1)
    bound = float(low.sum() - mu @ rhs)
    x = np.zeros((n, k))
    x[uu, pp] = res.x
    inc = _best_rounding(problem, x, allowed, cost)
    if inc is None:
        return None
    ub = float(cost[np.arange(n), inc].sum())
    tol = 1e-9 * max(1.0, abs(ub), abs(bound))
    rc = lag - low[:, None]
    full = ub - bound + tol
    # Grow the core (doubling g): options with rc <= g.  The best plan found, of cost c, is
    # optimal once c - L <= g (a better plan could only use options with rc <= c - L, all of
    # which the restricted problem had); at g = UB - L the restriction is exact by step 3.
    pos = np.sort(rc[np.isfinite(rc) & (rc > tol)])
    g = min(full, float(pos[min(len(pos) - 1, 64)])) if len(pos) else full
    best, best_c = inc, ub
    while True:
        got = _solve_restricted(problem, allowed & (rc <= g), lag, cost, A, rhs, time_limit)
        if got is not None:
            c = float(cost[np.arange(n), got].sum())
            if c < best_c:
                best, best_c = got, c
        if best_c - bound <= g + tol or g >= full:
            return best
        g = min(full, 2 * g)


def _solve_restricted(problem: Problem, keep: np.ndarray, lag: np.ndarray, cost: np.ndarray,
                      A: np.ndarray, rhs: np.ndarray, time_limit: float) -> np.ndarray | None:
    """Units with one option in ``keep`` fixed to it, the rest by HiGHS (``None``: infeasible
    or HiGHS' tolerance could not be met)."""
    n = len(keep)
    choice = np.where(keep, lag, np.inf).argmin(1)
    core = np.flatnonzero(keep.sum(1) > 1)
    if not len(core):
        return None if problem.violations(choice) else choice
    fixed = np.setdiff1d(np.arange(n), core)
    cu, cp = np.nonzero(keep[core])
    used = A[:, fixed, choice[fixed]].sum(1)
    eq = coo_matrix((np.ones(len(cu)), (cu, np.arange(len(cu)))),
                    shape=(len(core), len(cu))).tocsr()
    for margin in _TIGHTEN:
        r = milp(cost[core[cu], cp], integrality=np.ones(len(cu)), bounds=Bounds(0, 1),
                 constraints=[LinearConstraint(eq, 1.0, 1.0),
                              LinearConstraint(A[:, core[cu], cp], -np.inf,
                                               rhs - used - margin)],
                 options={"time_limit": time_limit, "mip_rel_gap": 1e-9, "presolve": False})
        if r.x is None:
            return None
        on = np.round(r.x) > 0.5
        choice[core[cu[on]]] = cp[on]
        if not problem.violations(choice):
            return choice
    return None


def solve_ilp(problem: Problem, *, time_limit: float = 60.0, use_dp: bool = True) -> np.ndarray:
    """Optimal candidate index per unit; ``ValueError`` when the budget cannot be met.

    A pure FP4-fraction budget whose units keep two options is a 0/1 knapsack over integer
    FLOP multiples and is solved exactly by dynamic programming (milliseconds for a 70B model,
    per GEMM) unless ``use_dp`` is false; everything else goes to HiGHS.
    """
    if problem.violations(problem.fp4.argmax(1)) and problem.budget.fp4_fraction is not None \
            and problem.budget.relative_time is None and problem.budget.memory_bytes is None:
        raise UserError(infeasible_message(problem))  # fast path: even all-FP4 falls short
    cols = _Columns.of(problem)
    if not len(cols.unit):
        if problem.violations(cols.base):
            raise UserError(infeasible_message(problem))
        return cols.base
    # Ties between formats of equal cost go to the earlier candidate (a tiny lexicographic
    # nudge, far below any real divergence difference).
    k = problem.cost.shape[1]
    nudge = 1e-12 * (1.0 + np.abs(problem.cost).max()) * np.arange(k)[None, :]
    c = cols.delta(problem.cost + nudge)
    b = problem.budget
    if use_dp and b.relative_time is not None and b.fp4_fraction and b.memory_bytes is None:
        keep = ~dominated(problem)
        keep[np.arange(len(keep)), keep.argmax(1)] = True
        choice = _solve_core(problem, keep, problem.cost + nudge, time_limit)
        if choice is not None:
            return choice
    if use_dp and b.relative_time is not None:
        choice = _solve_dp(problem)
        if choice is not None:
            return choice
    knapsack = _knapsack_weights(problem, cols) if use_dp else None
    if knapsack is not None:
        y = _solve_knapsack_dp(c, *knapsack)
        if y is None:
            raise UserError(infeasible_message(problem))
        choice = cols.choice(y.astype(float))
        if not problem.violations(choice):
            return choice
    for margin in _TIGHTEN:
        # HiGHS' presolve spends seconds merging the many identical knapsack columns of a
        # real model (same shapes repeat in every block); branch and bound alone is faster.
        res = milp(c, integrality=np.ones(len(c)), bounds=Bounds(0, 1),
                   constraints=[*_at_most_one_move(cols), *_budget_rows(problem, cols, margin)],
                   options={"time_limit": time_limit, "mip_rel_gap": 1e-9, "presolve": False})
        if res.x is None:
            raise UserError(infeasible_message(problem))
        choice = cols.choice(res.x)
        if not problem.violations(choice):
            return choice
    raise UserError(infeasible_message(problem))


def solve_milp_only(problem: Problem) -> np.ndarray:
    """:func:`solve_ilp` without the DP shortcut (for tests that compare the two)."""
    return solve_ilp(problem, use_dp=False)


def solve_brute_force(problem: Problem) -> np.ndarray:
    """Exhaustive reference for tiny problems (``k ** n`` assignments)."""
    n, k = problem.cost.shape
    if k**n > 2_000_000:
        raise UserError(f"brute force over {k}^{n} assignments is too large; use solve_ilp")
    best, best_cost = None, np.inf
    for combo in itertools.product(range(k), repeat=n):
        choice = np.array(combo)
        cost = problem.objective(choice)
        if cost < best_cost - 1e-12 and not problem.violations(choice):
            best, best_cost = choice, cost
    if best is None:
        raise UserError(infeasible_message(problem))
    return best


def never_chosen(problem: Problem) -> dict[str, str]:
    """Candidates that no optimal plan uses on any unit (dominated everywhere), with why."""
    dom = dominated(problem)
    out = {}
    for p, name in enumerate(problem.candidates):
        if len(dom) and dom[:, p].all():
            out[name] = ("another candidate is as accurate in the table and at least as good "
                         "on every active budget resource, for every unit")
    return out
