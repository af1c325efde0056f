"""The planning problem in array form: decision units, candidates, costs and resources.

A *decision unit* ``u`` is either one linear layer (all three GEMMs share a format, as in the
paper) or one GEMM of one layer (``per_gemm=True``).  For every unit and candidate format ``p``
the problem holds

* ``cost[u, p]``  -- the quality objective: normalised loss plus weight divergence (summed over
  the unit's GEMMs) from the :class:`~snip.sensitivity.SensitivityTable`;
* ``fp4[u, p]``   -- the unit's FLOPs if ``p`` has a 4-bit element, else 0;
* ``time[u, p]``  -- the unit's FLOPs over ``p``'s speed-up on a throughput profile;
* ``mem[u, p]``   -- weight bytes (fprop operand) plus saved-input bytes (wgrad operand).

All budgets are relative to the table's layers: the FP4-FLOP fraction is ``sum fp4 / sum F``
and the relative GEMM time is ``sum time / sum F`` (1.0 = all BF16), exactly as in
:mod:`snip.plan.cost`.  A :class:`Budget` bounds them, optionally per pipeline stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from snip.errors import UserError
from snip.formats import get_spec, is_fp4
from snip.plan.profiles import ThroughputProfile, get_profile
from snip.sensitivity.estimate import DEFAULT_CANDIDATES
from snip.sensitivity.table import GEMMS, SensitivityTable


@dataclass(frozen=True, kw_only=True)
class Budget:
    """Efficiency target: FP4-FLOP share ``>= fp4_fraction`` and/or relative GEMM time
    ``<= relative_time`` on ``profile``; optional weight+activation byte cap; optional pipeline
    stages (lists of layer names) that must each meet the same target."""

    fp4_fraction: float | None = None
    relative_time: float | None = None
    profile: str | ThroughputProfile = "blackwell"
    memory_bytes: float | None = None
    stages: tuple[tuple[str, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.fp4_fraction is None and self.relative_time is None:
            raise UserError("a budget needs fp4_fraction (e.g. 0.75) or relative_time "
                            "(e.g. 0.5 of all-BF16 GEMM time)")
        for name in ("fp4_fraction", "relative_time"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not 0.0 <= v <= 1.0):
                raise UserError(f"budget {name}={v!r} must be a number in [0, 1]")
        if self.memory_bytes is not None and not self.memory_bytes > 0:
            raise UserError(f"budget memory_bytes={self.memory_bytes!r} must be > 0")
        if self.stages is not None:
            object.__setattr__(self, "stages", tuple(tuple(s) for s in self.stages))
        object.__setattr__(self, "profile", get_profile(self.profile))

    @classmethod
    def of(cls, budget: Budget | float) -> Budget:
        """A float means an FP4-FLOP fraction."""
        if isinstance(budget, Budget):
            return budget
        return cls(fp4_fraction=budget)

    def describe(self) -> dict:
        d: dict = {}
        if self.fp4_fraction is not None:
            d["fp4_flop_fraction"] = self.fp4_fraction
        if self.relative_time is not None:
            d["relative_gemm_time"] = self.relative_time
            d["profile"] = self.profile.name
        if self.memory_bytes is not None:
            d["memory_bytes"] = self.memory_bytes
        if self.stages is not None:
            d["stages"] = len(self.stages)
        return d


@dataclass(frozen=True, kw_only=True)
class Problem:
    """Arrays of shape ``(units, candidates)``; ``units[u] = (layer, gemms)``."""

    units: tuple[tuple[str, tuple[str, ...]], ...]
    candidates: tuple[str, ...]
    cost: np.ndarray
    flops: np.ndarray
    fp4: np.ndarray
    time: np.ndarray
    mem: np.ndarray
    stage: np.ndarray
    budget: Budget
    n_stages: int = 1

    @property
    def total_flops(self) -> float:
        return float(self.flops.sum())

    def fp4_fraction(self, choice: np.ndarray, mask: np.ndarray | None = None) -> float:
        rows = np.arange(len(choice)) if mask is None else np.flatnonzero(mask)
        total = self.flops[rows].sum()
        return float(self.fp4[rows, choice[rows]].sum() / total) if total else 0.0

    def relative_time(self, choice: np.ndarray, mask: np.ndarray | None = None) -> float:
        rows = np.arange(len(choice)) if mask is None else np.flatnonzero(mask)
        total = self.flops[rows].sum()
        return float(self.time[rows, choice[rows]].sum() / total) if total else 1.0

    def memory(self, choice: np.ndarray) -> float:
        return float(self.mem[np.arange(len(choice)), choice].sum())

    def objective(self, choice: np.ndarray) -> float:
        return float(self.cost[np.arange(len(choice)), choice].sum())

    def violations(self, choice: np.ndarray, tol: float = 1e-9) -> list[str]:
        """Human-readable list of budget constraints ``choice`` breaks (empty: feasible)."""
        b, out = self.budget, []
        for k in range(self.n_stages):
            mask = self.stage == k if self.n_stages > 1 else None
            where = f" in stage {k}" if self.n_stages > 1 else ""
            frac, rel = self.fp4_fraction(choice, mask), self.relative_time(choice, mask)
            if b.fp4_fraction is not None and frac < b.fp4_fraction - tol:
                out.append(f"fp4 fraction {frac:.6f} < {b.fp4_fraction}{where}")
            if b.relative_time is not None and rel > b.relative_time + tol:
                out.append(f"relative time {rel:.6f} > {b.relative_time}{where}")
        if b.memory_bytes is not None and self.memory(choice) > b.memory_bytes * (1 + tol):
            out.append(f"memory {self.memory(choice):.6g} B > {b.memory_bytes:.6g} B")
        return out


def check_candidates(table: SensitivityTable, candidates: Sequence[str] | None,
                     budget: Budget) -> tuple[str, ...]:
    """Validate the candidate set against the table and the budget."""
    cands = tuple(get_spec(c).name for c in (candidates or _default_candidates(table)))
    if not cands:
        raise UserError("candidates is empty; pass e.g. ('fp8_e4m3_tile128', 'fp4_e2m1_tile128')")
    if len(set(cands)) != len(cands):
        raise UserError(f"candidates {cands} contain duplicates")
    missing = [c for c in cands if c not in table.candidates]
    if missing:
        raise UserError(f"candidate {missing[0]!r} was not measured in the sensitivity table "
                        f"(measured: {', '.join(table.candidates)}); re-run the statistics "
                        f"with it or drop it from candidates")
    if budget.fp4_fraction and not any(is_fp4(c) for c in cands):
        raise UserError(f"an FP4-FLOP budget of {budget.fp4_fraction} needs a 4-bit candidate, "
                        f"but candidates are {', '.join(cands)}; add e.g. 'fp4_e2m1_tile128' "
                        f"or 'nvfp4'")
    return cands


def _default_candidates(table: SensitivityTable) -> tuple[str, ...]:
    if all(c in table.candidates for c in DEFAULT_CANDIDATES):
        return DEFAULT_CANDIDATES
    return table.candidates


def _stage_index(names: Sequence[str], stages: tuple[tuple[str, ...], ...] | None) -> np.ndarray:
    if stages is None:
        return np.zeros(len(names), dtype=int)
    where = {}
    for k, members in enumerate(stages):
        for n in members:
            if n in where:
                raise UserError(f"layer {n!r} is in pipeline stages {where[n]} and {k}; "
                                f"each layer belongs to exactly one stage")
            where[n] = k
    missing = [n for n in names if n not in where]
    if missing:
        raise UserError(f"layer {missing[0]!r} is in no pipeline stage ({len(missing)} such "
                        f"layers); every table layer must be listed in budget.stages")
    unknown = [n for n in where if n not in set(names)]
    if unknown:
        raise UserError(f"pipeline stage lists {unknown[0]!r}, which is not in the table")
    return np.array([where[n] for n in names], dtype=int)


def build_problem(table: SensitivityTable, budget: Budget | float, *,
                  candidates: Sequence[str] | None = None, per_gemm: bool = False,
                  scores: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None) -> Problem:
    """Array form of the planning problem.

    ``scores`` (``{layer: {gemm: {cand: value}}}``) replaces the table's objective, e.g. for a
    baseline that ranks by relative quantization error.
    """
    budget = Budget.of(budget)
    cands = check_candidates(table, candidates, budget)
    prof = budget.profile
    speed = np.array([prof.speed(c) for c in cands])
    fp4_mask = np.array([is_fp4(c) for c in cands], dtype=float)
    w_bits = np.array([get_spec(c).for_weight().bits_per_element for c in cands])
    a_bits = np.array([get_spec(c).bits_per_element for c in cands])
    groups = [(n, (g,)) for n in table.layers for g in GEMMS] if per_gemm else \
             [(n, GEMMS) for n in table.layers]
    rows_cost, rows_flops, rows_mem = [], [], []
    for name, gemms in groups:
        e = table.layers[name]
        if scores is None:
            rows_cost.append([sum(e.metric(g, c).objective for g in gemms) for c in cands])
        else:
            rows_cost.append([sum(scores[name][g][c] for g in gemms) for c in cands])
        rows_flops.append(sum(e.flops[g] for g in gemms))
        mem = np.zeros(len(cands))
        if "fprop" in gemms:
            mem += e.params * w_bits / 8
        if "wgrad" in gemms:
            mem += table.tokens * e.in_features * a_bits / 8
        rows_mem.append(mem)
    flops = np.array(rows_flops, dtype=float)
    names = [n for n, _ in groups]
    stage = _stage_index(list(table.layers), budget.stages)
    stage_of = dict(zip(table.layers, stage, strict=True))
    cost = np.array(rows_cost, dtype=float)
    if not np.all(np.isfinite(cost)):
        raise UserError("the sensitivity table has non-finite divergences; re-run statistics "
                        "(a NaN/inf usually means the high-precision step itself diverged)")
    return Problem(units=tuple(groups), candidates=cands, cost=cost, flops=flops,
                   fp4=flops[:, None] * fp4_mask[None, :], time=flops[:, None] / speed[None, :],
                   mem=np.array(rows_mem), stage=np.array([stage_of[n] for n in names]),
                   budget=budget, n_stages=len(budget.stages) if budget.stages else 1)


def best_achievable(problem: Problem) -> dict[str, float]:
    """Per stage, the largest FP4 fraction and smallest relative time any choice reaches
    (ignoring the other constraints): what an infeasible-budget error reports."""
    out = {}
    for k in range(problem.n_stages):
        rows = problem.stage == k
        tot = problem.flops[rows].sum()
        key = f"stage {k} " if problem.n_stages > 1 else ""
        tot = tot or 1.0
        out[f"{key}max fp4 fraction"] = float(problem.fp4[rows].max(1).sum() / tot)
        out[f"{key}min relative time"] = float(problem.time[rows].min(1).sum() / tot)
    out["min memory bytes"] = float(problem.mem.min(1).sum())
    return out


def infeasible_message(problem: Problem) -> str:
    best = best_achievable(problem)
    got = ", ".join(f"{k} = {v:.6g}" for k, v in best.items())
    return (f"budget {problem.budget.describe()} is infeasible with candidates "
            f"{', '.join(problem.candidates)}: the largest achievable values are {got} "
            f"(each on its own); lower the target or add faster/4-bit candidates")
