"""Baseline planners: the heuristics SNIP is compared against, at the same budget.

Every baseline is an *order* over decision units plus one shared rule, the greedy fill:

1. start with every unit in the ``high`` format (the first candidate that is not 4-bit);
2. walk the order, switching units to the ``low`` format (the first 4-bit candidate; for a
   time-only budget, the fastest candidate) until the budget holds;
3. least overshoot: when the next unit in order would overshoot the target, switch instead the
   remaining unit whose gain is the smallest one that still reaches it (ties: earlier in order).
   So a baseline lands as close to ``r`` (from above) as its order allows and is never given more
   FP4 than SNIP's ILP.

With pipeline stages the fill runs per stage.  The orders:

=============== ==========================================================================
``uniform``     FP4-only: every unit ``low`` (meets any budget; the "uniform FP4" arm)
``layer_id``    keep the first and last transformer blocks high: middle blocks go low first
                (E-layer-id)
``layer_type``  keep sensitive layer types high: MLP gate/up first, then q/k, v, o, and the
                MLP down projection last (E-layer-type)
``min_rel_err`` lowest local relative quantization error ``||Q(T)-T||/||T||`` at ``low`` first,
                summed over the unit's GEMM operands (fprop: X, W; dgrad: dY, W; wgrad: dY, X)
``random``      a seeded random order
=============== ==========================================================================
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable

import numpy as np

from snip.errors import UserError
from snip.formats import is_fp4
from snip.planner.problem import Problem, infeasible_message
from snip.sensitivity.table import SensitivityTable


class Method(enum.Enum):
    ILP = "ilp"
    UNIFORM = "uniform"
    LAYER_ID = "layer_id"
    LAYER_TYPE = "layer_type"
    MIN_REL_ERR = "min_rel_err"
    RANDOM = "random"

    @classmethod
    def parse(cls, value: Method | str) -> Method:
        try:
            return cls(value)
        except ValueError:
            raise UserError(f"unknown planning method {value!r}; valid methods: "
                            f"{', '.join(m.value for m in cls)}") from None


# Order in which layer types go to FP4 (earlier = less sensitive by folklore).
TYPE_ORDER = (("w1", "w3", "gate_proj", "up_proj"), ("wq", "wk", "q_proj", "k_proj"),
              ("wv", "v_proj"), ("wo", "o_proj"), ("w2", "down_proj"))
_OPERANDS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}
_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")


def low_high(problem: Problem) -> tuple[int, int]:
    """Indices of the ``low`` and ``high`` candidates (module docstring)."""
    cands = problem.candidates
    fp4 = [i for i, c in enumerate(cands) if is_fp4(c)]
    if problem.budget.fp4_fraction is not None and fp4:
        low = fp4[0]
    else:
        low = int(np.argmin(problem.time[0])) if len(problem.time) else 0
    highs = [i for i, c in enumerate(cands) if i != low and not is_fp4(c)]
    high = highs[0] if highs else next((i for i in range(len(cands)) if i != low), low)
    return low, high


def block_index(name: str) -> int | None:
    m = _BLOCK.search(name)
    return int(m.group(1)) if m else None


def _type_rank(name: str) -> int:
    last = name.rsplit(".", 1)[-1]
    return next((i for i, types in enumerate(TYPE_ORDER) if last in types), len(TYPE_ORDER))


def order_layer_id(problem: Problem) -> list[int]:
    blocks = [block_index(n) for n, _ in problem.units]
    known = [b for b in blocks if b is not None]
    first, last = (min(known), max(known)) if known else (0, 0)

    def depth_from_ends(u: int) -> int:
        b = blocks[u]
        return -1 if b is None else min(b - first, last - b)
    return sorted(range(len(problem.units)), key=lambda u: (-depth_from_ends(u), u))


def order_layer_type(problem: Problem) -> list[int]:
    return sorted(range(len(problem.units)),
                  key=lambda u: (_type_rank(problem.units[u][0]), u))


def order_min_rel_err(problem: Problem, table: SensitivityTable) -> list[int]:
    low = problem.candidates[low_high(problem)[0]]
    scores = []
    for name, gemms in problem.units:
        errs = table.layers[name].rel_err.get(low)
        if not errs:
            raise UserError(f"layer {name!r} has no relative quantization error for {low!r} in "
                            f"the sensitivity table; min_rel_err needs the statistics pass")
        scores.append(sum(errs[op] for g in gemms for op in _OPERANDS[g]))
    return sorted(range(len(scores)), key=lambda u: (scores[u], u))


def order_random(problem: Problem, seed: int) -> list[int]:
    return [int(u) for u in np.random.default_rng(seed).permutation(len(problem.units))]


def _gain_fn(problem: Problem, low: int, high: int) -> Callable[[int], float]:
    if problem.budget.fp4_fraction is not None:
        return lambda u: float(problem.fp4[u, low] - problem.fp4[u, high])
    return lambda u: float(problem.time[u, high] - problem.time[u, low])


def _need(problem: Problem, choice: np.ndarray, rows: np.ndarray) -> float:
    """FLOPs of FP4 (or time units) still missing in ``rows`` for the primary target."""
    b, tot = problem.budget, problem.flops[rows].sum()
    if b.fp4_fraction is not None:
        return b.fp4_fraction * tot - problem.fp4[rows, choice[rows]].sum()
    return problem.time[rows, choice[rows]].sum() - b.relative_time * tot


def greedy_fill(problem: Problem, order: list[int]) -> np.ndarray:
    """Switch units ``high -> low`` in ``order`` until the budget holds (least overshoot)."""
    low, high = low_high(problem)
    gain = _gain_fn(problem, low, high)
    choice = np.full(len(problem.units), high)
    for s in range(problem.n_stages):
        rows = np.flatnonzero(problem.stage == s)
        todo = [u for u in order if problem.stage[u] == s]
        while todo and _need(problem, choice, rows) > 1e-9 * problem.flops[rows].sum():
            need = _need(problem, choice, rows)
            u = todo[0]
            if gain(u) > need:  # the next one overshoots: take the tightest one that suffices
                fits = [v for v in todo if gain(v) >= need]
                u = min(fits, key=lambda v: (gain(v), todo.index(v)))
            todo.remove(u)
            choice[u] = low
    for u in order:  # secondary constraints (time with an FP4 target): keep filling in order
        if not problem.violations(choice):
            break
        choice[u] = low
    if problem.violations(choice):
        raise UserError(infeasible_message(problem))
    return choice


def solve_baseline(problem: Problem, method: Method, table: SensitivityTable,
                   seed: int = 0) -> np.ndarray:
    if method is Method.UNIFORM:
        low, _ = low_high(problem)
        choice = np.full(len(problem.units), low)
        if problem.violations(choice):
            raise UserError(infeasible_message(problem))
        return choice
    orders = {Method.LAYER_ID: lambda: order_layer_id(problem),
              Method.LAYER_TYPE: lambda: order_layer_type(problem),
              Method.MIN_REL_ERR: lambda: order_min_rel_err(problem, table),
              Method.RANDOM: lambda: order_random(problem, seed)}
    return greedy_fill(problem, orders[method]())
