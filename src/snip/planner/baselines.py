"""Baseline planners: the heuristics SNIP is compared against, at *exactly* SNIP's efficiency.

A comparison between SNIP and a heuristic is only fair when both spend the same FP4 FLOPs.  A
greedy "fill until the budget holds" does not give that: on a model whose layers have unequal
sizes it lands wherever its order takes it (0.875 where the ILP reached 0.8125 on a 75 % budget,
and a third of random orders overshoot).  So every baseline here is an *order* over decision
units plus one shared rule, the **matched fill** (our reconstruction; the paper does not say how
its baselines were held at the budget):

1. every unit starts in the ``high`` format and may move to the ``low`` format
   (:func:`low_high`);
2. the *target* is what a reference plan achieved -- by default SNIP's ILP on the same table and
   budget (:func:`snip.planner.solve` solves it first): its FP4 FLOPs (per pipeline stage), or
   for a time-only budget its relative GEMM time;
3. among all sets of ``low`` units whose FP4 FLOPs equal the target, take the one that follows
   the order as closely as possible: the lexicographically first in the order (walk the order;
   switch a unit whenever the rest of the order can still complete the exact sum).  When the
   heuristic's own greedy prefix lands exactly, that is the prefix.
4. When no set hits the target exactly (a time target, or a reference planned at another
   granularity), the target becomes the smallest reachable amount above it -- less than one
   unit's FLOPs more, so the budget still holds -- and step 3 runs on that.

Sums are exact integer arithmetic over FLOPs in units of their gcd (a subset-sum over bitsets);
when that table would be too large (odd layer sizes) the fill falls back to the greedy
"least overshoot" rule and the plan records ``exact: false``.  The orders:

=============== ==========================================================================
``uniform``     FP4-only: every unit ``low`` (the "uniform FP4" arm; no matching)
``layer_id``    keep the first and last transformer blocks high: middle blocks go low first
                (E-layer-id)
``layer_type``  keep sensitive layer types high: MLP gate/up first, then q/k, v, o, and the
                MLP down projection last (E-layer-type)
``*_rev``       ``layer_id_rev``, ``layer_type_rev``: the same orders with the tie-break
                mirrored (below)
``min_rel_err`` lowest local relative quantization error ``||Q(T)-T||/||T||`` at ``low`` first,
                summed over the unit's GEMM operands (fprop: X, W; dgrad: dY, W; wgrad: dY, X)
``random``      a fixed random order per seed: a pure function of (number of units, seed), so
                ``seed=k`` gives the same draw in every re-planning cycle
``random_top``  SNIP's own top-``top`` units (largest objective increase ``cost[u, low] -
                cost[u, high]`` in the table; ties: lower index) kept high, every other unit in
                the random order of ``seed``: the control for "SNIP's allocation beyond spotting
                the outlier layer(s)". The fill runs without the top units; only when it
                cannot hit the target exactly without them do they join, last in the order.
``oracle``      not an order: the same knapsack as the ILP on *measured* single-unit damage
                (:mod:`snip.planner.oracle`), at the same exact target
=============== ==========================================================================

**Tie-breaks.**  ``layer_id`` and ``layer_type`` rank units by a coarse key (depth from the
ends, layer type) that many units share.  Ties are broken by *unit index*, the model's module
order: block 0 before block 1, and inside a block ``wq, wk, wv, wo, w1, w2, w3`` (per GEMM:
fprop, dgrad, wgrad), so block 0's ``w2`` goes to ``low`` before block 5's.  The ``_rev``
variants break the same ties by *reverse* unit index (last block first).  Neither is more
principled; a comparison whose result flips between the two is decided by the tie-break, not
by the rule, so report both.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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
    ORACLE = "oracle"
    LAYER_ID_REV = "layer_id_rev"
    LAYER_TYPE_REV = "layer_type_rev"
    RANDOM_TOP = "random_top"

    @classmethod
    def parse(cls, value: Method | str) -> Method:
        try:
            return cls(value)
        except ValueError:
            raise UserError(f"unknown planning method {value!r}; valid methods: "
                            f"{', '.join(m.value for m in cls)}") from None

    @property
    def matched(self) -> bool:
        """Whether the method is held at a reference plan's efficiency (everything but the ILP
        itself and ``uniform``)."""
        return self not in (Method.ILP, Method.UNIFORM)


# Order in which layer types go to FP4 (earlier = less sensitive by folklore).
TYPE_ORDER = (("w1", "w3", "gate_proj", "up_proj"), ("wq", "wk", "q_proj", "k_proj"),
              ("wv", "v_proj"), ("wo", "o_proj"), ("w2", "down_proj"))
_OPERANDS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}
_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
_MAX_BITS = 2_000_000_000  # units x reachable sums of the subset-sum bitsets (~250 MB)


def _fastest(problem: Problem, idx: Sequence[int]) -> int:
    """The fastest of ``idx`` on the budget's profile (ties: the earlier candidate)."""
    time = problem.time[0] if len(problem.time) else np.zeros(len(problem.candidates))
    return min(idx, key=lambda i: (time[i], i))


def low_high(problem: Problem) -> tuple[int, int]:
    """Indices of the ``low`` and ``high`` candidates of the baselines.

    * ``low``: with an FP4 target, the fastest 4-bit candidate (ties: the first listed);
      for a time-only budget, the fastest candidate.
    * ``high``: the first candidate that is not 4-bit; when the budget has both an FP4 target
      and a time limit, the fastest such candidate, so that a baseline at the ILP's FP4 fraction
      is at least as fast as the ILP (which then also meets the time limit).
    """
    cands, b = problem.candidates, problem.budget
    fp4 = [i for i, c in enumerate(cands) if is_fp4(c)]
    if b.fp4_fraction is not None and fp4:
        low = _fastest(problem, fp4)
    else:
        low = _fastest(problem, range(len(cands)))
    highs = [i for i, c in enumerate(cands) if i != low and not is_fp4(c)]
    if not highs:
        highs = [i for i in range(len(cands)) if i != low] or [low]
    both = b.fp4_fraction is not None and b.relative_time is not None
    return low, (_fastest(problem, highs) if both else highs[0])


def block_index(name: str) -> int | None:
    m = _BLOCK.search(name)
    return int(m.group(1)) if m else None


def _type_rank(name: str) -> int:
    last = name.rsplit(".", 1)[-1]
    return next((i for i, types in enumerate(TYPE_ORDER) if last in types), len(TYPE_ORDER))


def _tie(u: int, reverse: bool) -> int:
    """The tie-break key of unit ``u``: its index, or the reverse order (module docstring)."""
    return -u if reverse else u


def order_layer_id(problem: Problem, reverse_ties: bool = False) -> list[int]:
    blocks = [block_index(n) for n, _ in problem.units]
    known = [b for b in blocks if b is not None]
    first, last = (min(known), max(known)) if known else (0, 0)

    def depth_from_ends(u: int) -> int:
        b = blocks[u]
        return -1 if b is None else min(b - first, last - b)
    return sorted(range(len(problem.units)),
                  key=lambda u: (-depth_from_ends(u), _tie(u, reverse_ties)))


def order_layer_type(problem: Problem, reverse_ties: bool = False) -> list[int]:
    return sorted(range(len(problem.units)),
                  key=lambda u: (_type_rank(problem.units[u][0]), _tie(u, reverse_ties)))


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
    """A fixed permutation per ``seed``: depends on nothing but the unit count and the seed."""
    return [int(u) for u in np.random.default_rng(seed).permutation(len(problem.units))]


def top_units(problem: Problem, top: int) -> list[int]:
    """SNIP's ``top`` most sensitive units: the largest ``cost[u, low] - cost[u, high]`` first
    (ties: lower unit index)."""
    low, high = low_high(problem)
    gain = problem.cost[:, low] - problem.cost[:, high]
    return sorted(range(len(problem.units)), key=lambda u: (-gain[u], u))[:max(top, 0)]


def order_random_top(problem: Problem, seed: int, top: int) -> list[int]:
    """Every unit but SNIP's top ``top`` in the random order of ``seed`` (the same permutation
    as ``random``, with the top units taken out), then the top units, least sensitive first."""
    keep = top_units(problem, top)
    rest = [u for u in order_random(problem, seed) if u not in keep]
    return rest + keep[::-1]


# -- targets ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """What a matched fill must reach, per pipeline stage, in FLOPs switched to ``low``.

    ``flops[s]`` is the amount of stage ``s``'s FLOPs the fill moves to ``low``; ``exact`` says
    whether it must be hit exactly (an FP4 target) or is a lower bound (a time target, where the
    amount is the least that reaches the reference's relative time)."""

    flops: tuple[float, ...]
    exact: bool


def target_of(problem: Problem, reference: np.ndarray) -> Target:
    """The matched-fill target for reference choice ``reference`` (a candidate index per unit
    of ``problem``, e.g. the ILP's)."""
    low, high = low_high(problem)
    out = []
    for s in range(problem.n_stages):
        rows = np.flatnonzero(problem.stage == s)
        if problem.budget.fp4_fraction is not None:
            out.append(float(problem.fp4[rows, reference[rows]].sum()))
            continue
        # time: all-high time minus low-FLOPs x (per-FLOP saving) must be <= the reference's
        ref_time = float(problem.time[rows, reference[rows]].sum())
        per_flop = 1.0 / problem.budget.profile.speed(problem.candidates[high]) - \
            1.0 / problem.budget.profile.speed(problem.candidates[low])
        high_time = float(problem.time[rows, high].sum())
        out.append(max(high_time - ref_time, 0.0) / per_flop if per_flop > 0 else 0.0)
    return Target(tuple(out), exact=problem.budget.fp4_fraction is not None)


def target_of_fraction(problem: Problem, fraction: float) -> Target:
    """The target for an FP4 fraction given as a number (the same in every stage)."""
    return Target(tuple(fraction * float(problem.flops[problem.stage == s].sum())
                        for s in range(problem.n_stages)), exact=True)


# -- the matched fill --------------------------------------------------------------------------

def integer_weights(flops: np.ndarray) -> tuple[np.ndarray, int] | None:
    """FLOPs as integers in units of their gcd (``None``: not integral)."""
    if not len(flops) or np.any(flops != np.round(flops)) or flops.max() > 2**62:
        return None
    g = int(np.gcd.reduce(np.round(flops).astype(np.int64)))
    if g <= 0:
        return None
    return np.round(flops).astype(np.int64) // g, g


def ordered_subset(weights: Sequence[int] | Mapping[int, int], order: Sequence[int],
                   target: int) -> list[int] | None:
    """The lexicographically first (in ``order``) subset of ``order`` whose weight sum is the
    smallest reachable sum ``>= target``; ``None`` when no subset reaches ``target``.

    ``reach[k]`` is a bitset of the sums the suffix ``order[k:]`` can make; walking the order,
    a unit is taken whenever the remainder is still reachable by the rest of the order.
    """
    if target <= 0:
        return []
    n = len(order)
    cap = target + max((int(weights[u]) for u in order), default=0)
    mask = (1 << (cap + 1)) - 1
    reach = [0] * (n + 1)
    reach[n] = 1
    for k in range(n - 1, -1, -1):
        reach[k] = (reach[k + 1] | (reach[k + 1] << int(weights[order[k]]))) & mask
    above = reach[0] >> target
    if not above:
        return None
    t = target + (above & -above).bit_length() - 1
    chosen = []
    for k, u in enumerate(order):
        w = int(weights[u])
        if t >= w and (reach[k + 1] >> (t - w)) & 1:
            chosen.append(u)
            t -= w
            if t == 0:
                break
    return chosen


def matched_fill(problem: Problem, order: list[int], target: Target) -> tuple[np.ndarray, bool]:
    """Units ``high -> low`` following ``order``, FLOPs moved = ``target`` per stage (module
    docstring); returns the choice and whether every stage hit its target exactly."""
    low, high = low_high(problem)
    choice = np.full(len(problem.units), high)
    exact = True
    for s in range(problem.n_stages):
        todo = [u for u in order if problem.stage[u] == s]
        iw = integer_weights(problem.flops[todo]) if todo else None
        want = target.flops[s]
        picked = None
        if iw is not None:
            w_sub, g = iw
            weights = dict(zip(todo, (int(x) for x in w_sub), strict=True))
            need = int(np.ceil(want / g - 1e-9))
            if len(todo) * (need + max(weights.values()) + 1) <= _MAX_BITS:
                picked = ordered_subset(weights, todo, need)
                if picked is not None:
                    got = sum(weights[u] for u in picked)
                    exact &= got * g == round(want) if target.exact else got == need
        if picked is None:  # too large for exact sums: greedy least overshoot
            picked, exact = _least_overshoot(problem, todo, want), False
        choice[picked] = low
    for u in order:  # secondary constraints (e.g. memory): keep filling in order
        if not problem.violations(choice):
            break
        if choice[u] != low:
            choice[u] = low
            exact = False
    if problem.violations(choice):
        raise UserError(infeasible_message(problem))
    return choice, exact


def _least_overshoot(problem: Problem, todo: list[int], want: float) -> list[int]:
    gain = problem.flops
    picked, have, todo = [], 0.0, list(todo)
    while todo and have < want - 1e-9 * max(want, 1.0):
        u = todo[0]
        if have + gain[u] > want:  # the next one overshoots: the tightest one that suffices
            fits = [v for v in todo if have + gain[v] >= want]
            u = min(fits, key=lambda v: (gain[v], todo.index(v))) if fits else u
        todo.remove(u)
        picked.append(u)
        have += gain[u]
    return picked


def baseline_order(problem: Problem, method: Method, table: SensitivityTable,
                   seed: int = 0, top: int = 1) -> list[int]:
    orders: dict[Method, Callable[[], list[int]]] = {
        Method.LAYER_ID: lambda: order_layer_id(problem),
        Method.LAYER_TYPE: lambda: order_layer_type(problem),
        Method.LAYER_ID_REV: lambda: order_layer_id(problem, reverse_ties=True),
        Method.LAYER_TYPE_REV: lambda: order_layer_type(problem, reverse_ties=True),
        Method.MIN_REL_ERR: lambda: order_min_rel_err(problem, table),
        Method.RANDOM: lambda: order_random(problem, seed),
        Method.RANDOM_TOP: lambda: order_random_top(problem, seed, top)}
    if method not in orders:
        raise UserError(f"method {method.value!r} is not an order-based baseline")
    return orders[method]()


def solve_uniform(problem: Problem) -> np.ndarray:
    low, _ = low_high(problem)
    choice = np.full(len(problem.units), low)
    if problem.violations(choice):
        raise UserError(infeasible_message(problem))
    return choice


def solve_baseline(problem: Problem, method: Method, table: SensitivityTable, seed: int,
                   target: Target, top: int = 1) -> tuple[np.ndarray, bool]:
    """A baseline's choice at ``target`` and whether it was hit exactly (``top``: the units
    ``random_top`` keeps high)."""
    if method is Method.UNIFORM:
        return solve_uniform(problem), True
    order = baseline_order(problem, method, table, seed, top)
    if method is Method.RANDOM_TOP and top > 0:
        # the top units stay out of the fill whenever the target is exact without them (the
        # lexicographic walk over the whole order could still take one to close the sum)
        try:
            choice, exact = matched_fill(problem, order[:-top], target)
        except UserError:  # the budget needs (some of) them
            exact = False
        if exact:
            return choice, exact
    return matched_fill(problem, order, target)
