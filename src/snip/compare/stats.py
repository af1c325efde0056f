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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
