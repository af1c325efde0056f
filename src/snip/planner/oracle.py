"""The ``oracle`` baseline: SNIP's knapsack on *measured* single-unit damage.

SNIP's objective predicts, for every layer (or GEMM), how much the loss and the weights would
suffer in a low format.  To validate it, measure the real thing: switch one decision unit alone
from ``high`` to ``low``, evaluate the loss on held-out batches, and subtract the all-``high``
loss.  :func:`measure_damage` does that through a callable ``loss_of(plan) -> float`` that the
caller supplies (the product's evaluation on strided validation batches, say), so this module
knows nothing about models or training loops.  It costs ``units + 1`` evaluations.

:func:`snip.planner.solve` with ``method="oracle", damage=...`` then solves the same knapsack
as the ILP with the measured damage as the cost of ``low`` (and 0 for ``high``), held at exactly
the FP4 FLOPs the ILP achieved (:mod:`snip.planner.baselines`): the best any additive per-unit
score could do at that efficiency.  Interactions between units are ignored, as they are by
SNIP's objective (our reconstruction of an upper reference; the paper has no oracle arm).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from snip.errors import UserError
from snip.formats import get_spec
from snip.plan import PrecisionPlan
from snip.sensitivity.table import GEMMS

Unit = tuple[str, tuple[str, ...]]


def unit_key(unit: Unit) -> str:
    """``"layer"`` for a whole layer, ``"layer:gemm"`` for one GEMM (the JSON key)."""
    name, gemms = unit
    return name if tuple(gemms) == GEMMS else f"{name}:{'+'.join(gemms)}"


@dataclass(frozen=True, kw_only=True)
class Damage:
    """Measured loss increase of each decision unit switched alone from ``high`` to ``low``."""

    high: str
    low: str
    per_gemm: bool
    base_loss: float
    values: Mapping[str, float]  # unit_key -> loss(unit low) - base_loss

    def __post_init__(self) -> None:
        object.__setattr__(self, "high", get_spec(self.high).name)
        object.__setattr__(self, "low", get_spec(self.low).name)
        vals = {str(k): float(v) for k, v in self.values.items()}
        bad = [k for k, v in vals.items() if not np.isfinite(v)]
        if bad:
            raise UserError(f"damage of {bad[0]!r} is not finite; the evaluation diverged")
        object.__setattr__(self, "values", vals)

    def of(self, unit: Unit) -> float:
        key = unit_key(unit)
        if key not in self.values:
            raise UserError(f"the damage table has no entry for {key!r} (measured "
                             f"{'per GEMM' if self.per_gemm else 'per layer'}); measure it "
                             f"with the same per_gemm setting as the plan")
        return self.values[key]

    def to_dict(self) -> dict:
        return {"high": self.high, "low": self.low, "per_gemm": self.per_gemm,
                "base_loss": self.base_loss, "values": dict(self.values)}

    @classmethod
    def from_dict(cls, d: Mapping) -> Damage:
        return cls(high=d["high"], low=d["low"], per_gemm=bool(d["per_gemm"]),
                   base_loss=float(d["base_loss"]), values=d["values"])


def units_of(layers: Iterable[str], per_gemm: bool) -> list[Unit]:
    """Decision units in the planner's order (layer-major, GEMMs in ``GEMMS`` order)."""
    return [(n, (g,)) for n in layers for g in GEMMS] if per_gemm else \
        [(n, GEMMS) for n in layers]


def single_unit_plan(layers: Sequence[str], high: str, low: str,
                     unit: Unit | None) -> PrecisionPlan:
    """Every layer ``high`` except ``unit``'s GEMMs in ``low`` (``None``: all high)."""
    table = {n: dict.fromkeys(GEMMS, high) for n in layers}
    if unit is not None:
        for g in unit[1]:
            table[unit[0]][g] = low
    return PrecisionPlan(default=dict.fromkeys(GEMMS, high), layers=table,
                         meta={"oracle_unit": None if unit is None else unit_key(unit)})


def measure_damage(layers: Iterable[str], loss_of: Callable[[PrecisionPlan], float], *,
                   high: str, low: str, per_gemm: bool = False) -> Damage:
    """Loss increase of each unit of ``layers`` switched alone to ``low`` (module docstring).

    ``loss_of`` must be deterministic (same batches, same rounding) for the differences to mean
    anything; it is called once for the all-``high`` plan and once per unit.
    """
    layers = list(layers)
    if not layers:
        raise UserError("measure_damage needs at least one layer name")
    base = float(loss_of(single_unit_plan(layers, high, low, None)))
    values = {unit_key(u): float(loss_of(single_unit_plan(layers, high, low, u))) - base
              for u in units_of(layers, per_gemm)}
    return Damage(high=high, low=low, per_gemm=per_gemm, base_loss=base, values=values)


def min_cost_exact_sum(cost: np.ndarray, weight: np.ndarray, target: int) -> np.ndarray | None:
    """Exact ``argmin cost.y  s.t.  weight.y == target``, ``y`` binary (``None``: unreachable).

    ``best[k]`` is the least cost of a subset summing to exactly ``k``; one row of "taken"
    flags per item is kept for backtracking (``items x (target + 1)`` bytes).
    """
    n = len(cost)
    y = np.zeros(n, dtype=bool)
    if target < 0:
        return None
    if target == 0:
        return y
    best = np.full(target + 1, np.inf)
    best[0] = 0.0
    take = np.zeros((n, target + 1), dtype=bool)
    for j in range(n):
        w = int(weight[j])
        if w > target:
            continue
        cand = np.full(target + 1, np.inf)
        cand[w:] = best[:target + 1 - w] + cost[j]
        better = cand < best
        take[j] = better
        best = np.where(better, cand, best)
    if not np.isfinite(best[target]):
        return None
    k = target
    for j in range(n - 1, -1, -1):
        if take[j, k]:
            y[j] = True
            k -= int(weight[j])
    return y
