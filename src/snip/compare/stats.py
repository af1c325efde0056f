"""Paired statistics for "recipe A beats recipe B": differences per unit, not per arm means.

Every arm of a comparison is trained from the same states with the same batches and evaluated
on the same windows, one *unit* per (base checkpoint, data order). The unit's own difficulty
(how good its base is, how lucky its batches are) is then shared by all arms and cancels in the
per-unit difference ``d_u = L_arm,u - L_ref,u``; what remains is the effect plus noise that is
typically several times smaller than the spread of the raw losses. With ``n`` units:

* mean ``d``, and the 95% Student-t interval ``d +- t_{0.975, n-1} s / sqrt(n)`` (``s``: the
  sample standard deviation of the ``d_u``); undefined for ``n < 2``;
* the sign test (two-sided binomial on how many ``d_u`` are negative, zeros dropped) and the
  Wilcoxon signed-rank test (exact for small ``n``), which do not assume normal differences;
* for a family of random plans, the share of them an arm beats (its percentile);
* "share of the gap closed", ``(L_gap - L_arm) / (L_gap - L_ref)`` on unit means, only when the
  gap itself (the gap arm's paired difference to the reference) has an interval that excludes
  zero: a ratio over an unresolved gap is noise over noise.

Negative differences mean the arm has the lower (better) loss than the reference.

**Pre-registered hypotheses** (:func:`evaluate_hypotheses`).  A :class:`HypothesisSpec` names
contrasts ``arm - comparator`` (the comparator may be a random family's label: its per-unit
mean of draws, or ``search:FAMILY``: the search oracle, below).  Each contrast is computed

* with the *base* as the unit: where a base has several data orders, its orders' differences
  are averaged first and the t interval is over the base means (orders of one base share the
  base and are not independent);
* in high precision (the primary metric) and as run (the secondary one);

and gets a :class:`Verdict` with the smallest effect worth having, ``delta_min``:

* ``supported``: the upper bound is below 0 in both metrics (checked first: an effect that is
  real but smaller than ``delta_min`` is supported, flagged ``below_delta_min``);
* ``falsified``: the primary interval lies entirely above ``-delta_min`` (it excludes a benefit
  of ``delta_min``);
* ``inconclusive``: neither.

A hypothesis is supported when all its contrasts are, falsified when any is, else inconclusive.
They are tested in their declared order (fixed-sequence testing, each at the 95 % level): the
first one not supported stops the confirmatory sequence, and every later verdict is printed as
exploratory (``confirmatory=False``); a spec marked ``exploratory`` is reported and never part
of the sequence.

**Search oracle** (the ceiling).  ``search:FAMILY`` is, in every unit, the draw of the family
with the lowest loss on half ``a`` of the validation windows, reported on half ``b``
(`snip.compare.halves`); the arm it is compared with is then also taken on half ``b``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from snip.errors import UserError


@dataclass(frozen=True)
class Paired:
    """The paired difference ``arm - reference`` over ``n`` units."""

    arm: str
    reference: str
    diffs: tuple[float, ...]
    mean: float
    ci_low: float
    ci_high: float
    sign_p: float
    wilcoxon_p: float

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def resolved(self) -> bool:
        """The 95% interval excludes zero."""
        return self.ci_low > 0 or self.ci_high < 0


def t_interval(x: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``x`` and its ``level`` Student-t interval (NaN bounds for fewer than 2 values)."""
    x = np.asarray(x, dtype=np.float64)
    n, mean = len(x), float(x.mean())
    if n < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return mean, mean - half, mean + half


def paired(arm: str, values: Sequence[float], reference: str, ref_values: Sequence[float],
           level: float = 0.95) -> Paired:
    """Paired difference of ``values`` and ``ref_values`` (same units, same order)."""
    if len(values) != len(ref_values) or not values:
        raise UserError(f"paired statistics need the same non-zero number of units for {arm!r} "
                         f"({len(values)}) and {reference!r} ({len(ref_values)})")
    d = np.asarray(values, dtype=np.float64) - np.asarray(ref_values, dtype=np.float64)
    mean, lo, hi = t_interval(d, level)
    nonzero = d[d != 0]
    sign_p = (float(stats.binomtest(int((nonzero < 0).sum()), len(nonzero), 0.5).pvalue)
              if len(nonzero) else 1.0)
    wilcoxon_p = float(stats.wilcoxon(nonzero).pvalue) if len(nonzero) else 1.0
    return Paired(arm=arm, reference=reference, diffs=tuple(float(x) for x in d), mean=mean,
                  ci_low=lo, ci_high=hi, sign_p=sign_p, wilcoxon_p=wilcoxon_p)


def percentile_among(value: float, draws: Sequence[float]) -> float:
    """Percent of ``draws`` that ``value`` beats (lower is better; ties count half)."""
    draws_a = np.asarray(draws, dtype=np.float64)
    if not len(draws_a):
        return math.nan
    return float(100 * ((draws_a > value).sum() + 0.5 * (draws_a == value).sum()) / len(draws_a))


def gap_closed(arm_mean: float, gap_mean: float, ref_mean: float, gap: Paired) -> float | None:
    """Share of the reference-to-gap-arm loss gap that the arm closes; None when the gap's
    interval does not exclude zero (or runs the wrong way)."""
    if not gap.resolved or gap.mean <= 0:
        return None
    return (gap_mean - arm_mean) / (gap_mean - ref_mean)


# ---------------------------------------------------------------------------------------------
# Pre-registered hypotheses (module docstring)

Unit = tuple[int, int]
Values = Mapping[str, Mapping[Unit, Mapping[str, float]]]  # label -> unit -> metric -> value
PRIMARY, SECONDARY = "val_loss_hp", "val_loss"
SEARCH = "search:"


class Verdict(enum.Enum):
    SUPPORTED = "supported"
    FALSIFIED = "falsified"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class HypothesisSpec:
    """A declared hypothesis: every ``(arm, comparator)`` contrast must favour the arm."""

    id: str
    statement: str
    contrasts: tuple[tuple[str, str], ...]
    exploratory: bool = False  # reported, never part of the confirmatory sequence

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HypothesisSpec:
        try:
            pairs = tuple((str(a), str(c)) for a, c in d["contrasts"])
            return cls(id=str(d["id"]), statement=str(d["statement"]), contrasts=pairs,
                       exploratory=bool(d.get("exploratory", False)))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"hypothesis {d!r}: needs id, statement and contrasts "
                            f"[[ARM, COMPARATOR], ...] ({e})") from None


@dataclass(frozen=True)
class Contrast:
    """One contrast ``arm - comparator`` over independent bases, in one metric."""

    arm: str
    comparator: str
    metric: str
    n: int
    mean: float
    ci_low: float
    ci_high: float
    diffs: tuple[float, ...]  # one per base (orders averaged)


@dataclass(frozen=True)
class ContrastVerdict:
    """A contrast in both metrics and its verdict."""

    primary: Contrast
    secondary: Contrast
    verdict: Verdict
    below_delta_min: bool

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "below_delta_min": self.below_delta_min,
                "primary": self.primary.__dict__, "secondary": self.secondary.__dict__}


@dataclass(frozen=True)
class HypothesisResult:
    """The verdict of one hypothesis (what `snip compare --summarize` prints and the report
    draws: every contrast's interval, its verdict, and the hypothesis's)."""

    spec: HypothesisSpec
    contrasts: tuple[ContrastVerdict, ...]
    verdict: Verdict
    confirmatory: bool
    delta_min: float

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.spec.id, "statement": self.spec.statement,
                "verdict": self.verdict.value, "confirmatory": self.confirmatory,
                "delta_min": self.delta_min,
                "contrasts": [c.to_dict() for c in self.contrasts]}


def by_base(diffs: Mapping[Unit, float]) -> list[float]:
    """The mean difference of each base over its data orders, in base order."""
    groups: dict[int, list[float]] = {}
    for (b, _), d in sorted(diffs.items()):
        groups.setdefault(b, []).append(d)
    return [sum(v) / len(v) for _, v in sorted(groups.items())]


def _per_unit(values: Values, label: str, metric: str,
              families: Mapping[str, Sequence[str]]) -> dict[Unit, float]:
    """Per-unit values of an arm, a family (mean of its draws that finished in the unit, on
    units where all did) or a search oracle."""
    if label.startswith(SEARCH):
        fam = label[len(SEARCH):]
        members = families.get(fam)
        if not members:
            raise UserError(f"{label!r}: {fam!r} is not a random family of the sweep")
        return search_oracle(values, members, metric)
    if label in families:
        members = families[label]
        units = set.intersection(*(set(values.get(m, {})) for m in members))
        return {u: sum(values[m][u][metric] for m in members) / len(members) for u in units
                if all(metric in values[m][u] for m in members)}
    return {u: r[metric] for u, r in values.get(label, {}).items() if metric in r}


def search_oracle(values: Values, members: Sequence[str], metric: str) -> dict[Unit, float]:
    """Per unit, the member with the lowest ``metric`` on half a, its value on half b."""
    units = set.intersection(*(set(values.get(m, {})) for m in members))
    out = {}
    for u in units:
        rows = [values[m][u] for m in members]
        if all(f"{metric}_a" in r and f"{metric}_b" in r for r in rows):
            best = min(range(len(rows)), key=lambda i: (rows[i][f"{metric}_a"], i))
            out[u] = rows[best][f"{metric}_b"]
    return out


def contrast(values: Values, arm: str, comparator: str, metric: str,
             families: Mapping[str, Sequence[str]] | None = None,
             level: float = 0.95) -> Contrast:
    """``arm - comparator`` on the units where both finished, one value per base; against a
    search oracle both sides are taken on half b of the windows."""
    families = families or {}
    m_arm = f"{metric}_b" if comparator.startswith(SEARCH) else metric
    a = _per_unit(values, arm, m_arm, families)
    c = _per_unit(values, comparator, metric, families)
    units = sorted(set(a) & set(c))
    diffs = by_base({u: a[u] - c[u] for u in units})
    if not diffs:
        return Contrast(arm=arm, comparator=comparator, metric=metric, n=0, mean=math.nan,
                        ci_low=math.nan, ci_high=math.nan, diffs=())
    mean, lo, hi = t_interval(diffs, level)
    return Contrast(arm=arm, comparator=comparator, metric=metric, n=len(diffs), mean=mean,
                    ci_low=lo, ci_high=hi, diffs=tuple(diffs))


def verdict(primary: Contrast, secondary: Contrast, delta_min: float) -> tuple[Verdict, bool]:
    """The verdict of one contrast and whether it is also within ``delta_min`` of zero."""
    within = primary.ci_low > -delta_min
    if primary.ci_high < 0 and secondary.ci_high < 0:
        return Verdict.SUPPORTED, within
    return (Verdict.FALSIFIED if within else Verdict.INCONCLUSIVE), False


def evaluate_hypotheses(values: Values, hypotheses: Sequence[HypothesisSpec], delta_min: float,
                    families: Mapping[str, Sequence[str]] | None = None,
                    level: float = 0.95) -> list[HypothesisResult]:
    """Every hypothesis in its declared order (module docstring)."""
    if not delta_min > 0:
        raise UserError(f"delta_min={delta_min!r} must be > 0 (nats)")
    out, open_sequence = [], True
    for h in hypotheses:
        cvs = []
        for arm, comp in h.contrasts:
            p = contrast(values, arm, comp, PRIMARY, families, level)
            q = contrast(values, arm, comp, SECONDARY, families, level)
            v, below = verdict(p, q, delta_min)
            cvs.append(ContrastVerdict(primary=p, secondary=q, verdict=v, below_delta_min=below))
        kinds = {c.verdict for c in cvs}
        v = (Verdict.FALSIFIED if Verdict.FALSIFIED in kinds else
             Verdict.SUPPORTED if cvs and kinds == {Verdict.SUPPORTED} else
             Verdict.INCONCLUSIVE)
        out.append(HypothesisResult(spec=h, contrasts=tuple(cvs), verdict=v,
                                    confirmatory=open_sequence and not h.exploratory,
                                    delta_min=delta_min))
        if not h.exploratory:
            open_sequence = open_sequence and v is Verdict.SUPPORTED
    return out


def n_for_power(sd: float, delta: float, power: float = 0.8, level: float = 0.95) -> int:
    """Units for a two-sided ``level`` t test to detect ``delta`` at ``sd`` with ``power``
    (noncentral t, the smallest n >= 2)."""
    if not (sd > 0 and delta > 0):
        raise UserError("n_for_power needs sd > 0 and delta > 0")
    for n in range(2, 100_000):
        df, nc = n - 1, delta / sd * math.sqrt(n)
        crit = stats.t.ppf(0.5 + level / 2, df)
        if 1 - stats.nct.cdf(crit, df, nc) + stats.nct.cdf(-crit, df, nc) >= power:
            return n
    raise UserError("n_for_power: more than 100000 units")


def pilot_n(sds: Sequence[float], delta_min: float, lo: int = 32, hi: int = 48,
            current: int = 0) -> int:
    """The internal-pilot rule: units for 80 % power at ``delta_min`` under the largest SD of
    the pre-registered contrasts, clamped to [``lo``, ``hi``], never below ``current``."""
    need = max(n_for_power(sd, delta_min) for sd in sds) if sds else lo
    return max(min(max(need, lo), hi), current)
