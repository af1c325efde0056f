"""Pre-registered diagnostics: is an arm's win only the outlier layer?

In setting (a) of RESULTS §3c one layer carried 70-79 % of all single-layer FP4 damage, and
whether a plan kept it in high precision separated good plans from bad.  So, per unit (base,
order):

* the *damage map* at the branch point: each layer's measured loss increase alone in the low
  format, from the ``oracle`` arm's first cycle (``sensitivity/step_<N>_damage.json``, the same
  model and calibration batch every arm of the unit starts from);
* the *top unit*: the layer with the largest damage, and its share of the summed positive
  damage;
* for every arm, whether its first plan keeps the top unit high (no GEMM of it in a 4-bit
  format), and the share of its plans that do (adaptive arms re-plan);
* for every contrast ``arm - comparator`` of the hypotheses, the per-unit difference (high
  precision) regressed on "the comparator keeps the top unit high" (OLS with an intercept): the
  slope is the outlier effect, the mean over units where the comparator keeps it is the
  comparison beyond the outlier.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from snip.compare.arms import Arm
from snip.compare.stats import t_interval

Unit = tuple[int, int]


@dataclass(frozen=True)
class TopUnit:
    """The most damaging layer of one unit at the branch point."""

    unit: Unit
    layer: str
    damage: float
    share: float  # of the summed positive single-layer damage


@dataclass(frozen=True)
class Regression:
    """``d_u = alpha + beta * kept_u`` over units (``kept``: the comparator keeps the top high)."""

    arm: str
    comparator: str
    n: int
    n_kept: int
    beta: float
    beta_low: float
    beta_high: float
    mean_kept: float  # mean difference where the comparator keeps the top unit high
    mean_kept_low: float
    mean_kept_high: float


def plans_of(run_dir: Path) -> list[dict[str, Any]]:
    """The plans a branch trained with, by step (the controller's, when it re-planned)."""
    paths = sorted((run_dir / "plans").glob("step_*.json"), key=lambda p: int(p.stem[5:]))
    plans = [json.loads(p.read_text()) for p in paths]
    made = [p for p in plans if p.get("meta", {}).get("method")]
    return made or plans


def keeps_high(plan: dict[str, Any], layer: str) -> bool:
    from snip.formats import is_fp4

    entry = plan.get("layers", {}).get(layer) or plan.get("default", {})
    return not any(is_fp4(v) for v in entry.values())


def first_damage_map(run_dir: Path) -> dict[str, float] | None:
    """Layer -> measured damage from the first damage map of a branch (None: none measured)."""
    paths = sorted((run_dir / "sensitivity").glob("step_*_damage.json"),
                   key=lambda p: int(p.stem.split("_")[1]))
    return json.loads(paths[0].read_text())["values"] if paths else None


def top_unit(run_dir: Path, unit: Unit) -> TopUnit | None:
    """The top unit from the first damage map of an oracle branch (None: none measured)."""
    values = first_damage_map(run_dir)
    return None if values is None else top_of(values, unit)


def top_of(values: dict[str, float], unit: Unit) -> TopUnit:
    """The most damaging layer of a damage map (ties: the larger name) and its share."""
    layer = max(values, key=lambda k: (values[k], k))
    total = sum(v for v in values.values() if v > 0)
    return TopUnit(unit=unit, layer=layer, damage=values[layer],
                   share=values[layer] / total if total > 0 else math.nan)


def regress(arm: str, comparator: str, diffs: Sequence[float], kept: Sequence[bool]
            ) -> Regression:
    d, k = np.asarray(diffs, float), np.asarray(kept, float)
    n, nk = len(d), int(k.sum())
    beta = lo = hi = math.nan
    if n >= 3 and 0 < nk < n:
        x = np.column_stack([np.ones(n), k])
        coef, *_ = np.linalg.lstsq(x, d, rcond=None)
        resid = d - x @ coef
        cov = (resid @ resid / (n - 2)) * np.linalg.inv(x.T @ x)
        half = float(stats.t.ppf(0.975, n - 2) * math.sqrt(cov[1, 1]))
        beta, lo, hi = float(coef[1]), float(coef[1]) - half, float(coef[1]) + half
    mk, mlo, mhi = t_interval(d[k == 1]) if nk else (math.nan, math.nan, math.nan)
    return Regression(arm=arm, comparator=comparator, n=n, n_kept=nk, beta=beta, beta_low=lo,
                      beta_high=hi, mean_kept=mk, mean_kept_low=mlo, mean_kept_high=mhi)


def diagnostics(sweep: Any, results: dict[str, dict[Unit, dict[str, Any]]],
                damage_arm: str, pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Top units, per-arm "keeps the top high" and the regressions (module docstring);
    ``sweep`` is a `snip.compare.Sweep`, ``damage_arm`` the label of its oracle arm."""
    arms: dict[str, Arm] = {a.label: a for a in sweep.arms}
    if damage_arm not in arms:
        return {}
    tops = {u: t for u in sweep.units
            if (t := top_unit(sweep.run_dir(u, arms[damage_arm]), u)) is not None}
    kept: dict[str, dict[Unit, dict[str, Any]]] = {}
    for label, arm in arms.items():
        for u, t in tops.items():
            plans = plans_of(sweep.run_dir(u, arm))
            if plans and u in results.get(label, {}):
                flags = [keeps_high(p, t.layer) for p in plans]
                kept.setdefault(label, {})[u] = {"first": flags[0],
                                                 "share": sum(flags) / len(flags)}
    regs = []
    for arm, comp in pairs:
        units = sorted(set(kept.get(comp, {})) & set(results.get(arm, {})))
        diffs = [results[arm][u]["val_loss_hp"] - results[comp][u]["val_loss_hp"]
                 for u in units]
        regs.append(regress(arm, comp, diffs, [kept[comp][u]["first"] for u in units]))
    return {"damage_arm": damage_arm,
            "top_units": [asdict(t) | {"unit": list(t.unit)} for t in tops.values()],
            "keeps_top_high": {a: {f"b{u[0]}_o{u[1]}": v for u, v in by.items()}
                               for a, by in kept.items()},
            "regressions": [asdict(r) for r in regs]}
