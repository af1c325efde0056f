"""Rank statistics with honest intervals, for validating a sensitivity predictor.

A predictor (SNIP's per-layer divergence) is judged by how well it *ranks* decision units by
their measured damage.  Both sides are noisy, so every number here comes with its uncertainty:

* :func:`spearman` / :func:`kendall` -- rank correlations (``tau-b`` for Kendall; ties allowed).
* :func:`bootstrap_ci` -- percentile bootstrap interval of any statistic of paired samples,
  resampling *units* (rows) with replacement, optionally within strata (e.g. one stratum per
  checkpoint, so a pooled statistic averages per-checkpoint correlations and never compares
  ranks across checkpoints).  The same resamples serve :func:`paired_difference_ci`, which is
  how "predictor A ranks better than B" is decided: the interval of the *difference* of their
  correlations with the truth on identical resamples.
* :func:`spearman_brown` / :func:`split_half` -- reliability of a measurement averaged over
  ``n`` independent repetitions, from the correlation of two halves (the Spearman-Brown
  prophecy ``2r/(1+r)`` for two halves).
* :func:`noise_ceiling` -- ``sqrt(rel_truth * rel_pred)``: the correlation a *perfect*
  predictor could reach given how reliably both sides are measured (classical attenuation).

Pure numpy/scipy; no model code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

Stat = Callable[[np.ndarray, np.ndarray], float]


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation (``nan`` when either side is constant)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(_st.spearmanr(a, b)[0])


def kendall(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Kendall's tau-b (``nan`` when either side is constant)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(_st.kendalltau(a, b)[0])


def pearson(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


@dataclass(frozen=True)
class Interval:
    """A point estimate with its percentile-bootstrap interval."""

    value: float
    low: float
    high: float
    n: int
    level: float = 0.95

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n,
                "level": self.level}

    def __str__(self) -> str:
        return f"{self.value:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"


def _resamples(strata: np.ndarray, n_boot: int, seed: int) -> list[np.ndarray]:
    """``n_boot`` index vectors, each resampling every stratum with replacement."""
    rng = np.random.default_rng(seed)
    groups = [np.flatnonzero(strata == s) for s in np.unique(strata)]
    return [np.concatenate([rng.choice(g, size=len(g), replace=True) for g in groups])
            for _ in range(n_boot)]


def _stratified(stat: Stat, strata: np.ndarray) -> Callable[[np.ndarray, np.ndarray,
                                                             np.ndarray], float]:
    """``stat`` per stratum, averaged (``nan`` strata skipped)."""
    def f(a: np.ndarray, b: np.ndarray, s: np.ndarray) -> float:
        vals = [stat(a[s == k], b[s == k]) for k in np.unique(s)]
        vals = [v for v in vals if np.isfinite(v)]
        return float(np.mean(vals)) if vals else float("nan")
    return f


def _ci(values: np.ndarray, level: float) -> tuple[float, float]:
    v = values[np.isfinite(values)]
    if len(v) == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    return float(np.quantile(v, a)), float(np.quantile(v, 1 - a))


def bootstrap_ci(stat: Stat, a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                 *, strata: Sequence[int] | np.ndarray | None = None, n_boot: int = 2000,
                 level: float = 0.95, seed: int = 0) -> Interval:
    """``stat(a, b)`` (averaged over strata) with a percentile bootstrap interval over units."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"bootstrap_ci needs two equal-length vectors, got {a.shape}, {b.shape}")
    s = np.zeros(len(a), int) if strata is None else np.asarray(strata)
    f = _stratified(stat, s)
    boots = np.array([f(a[i], b[i], s[i]) for i in _resamples(s, n_boot, seed)])
    lo, hi = _ci(boots, level)
    return Interval(f(a, b, s), lo, hi, len(a), level)


def paired_difference_ci(stat: Stat, pred_a: Sequence[float] | np.ndarray,
                         pred_b: Sequence[float] | np.ndarray,
                         truth: Sequence[float] | np.ndarray, *,
                         strata: Sequence[int] | np.ndarray | None = None, n_boot: int = 2000,
                         level: float = 0.95, seed: int = 0) -> Interval:
    """``stat(pred_a, truth) - stat(pred_b, truth)`` on identical unit resamples."""
    pa, pb, t = (np.asarray(v, float) for v in (pred_a, pred_b, truth))
    if not (pa.shape == pb.shape == t.shape) or t.ndim != 1:
        raise ValueError("paired_difference_ci needs three equal-length vectors")
    s = np.zeros(len(t), int) if strata is None else np.asarray(strata)
    f = _stratified(stat, s)

    def diff(i: np.ndarray) -> float:
        return f(pa[i], t[i], s[i]) - f(pb[i], t[i], s[i])
    boots = np.array([diff(i) for i in _resamples(s, n_boot, seed)])
    lo, hi = _ci(boots, level)
    return Interval(diff(np.arange(len(t))), lo, hi, len(t), level)


def spearman_brown(r: float, factor: float = 2.0) -> float:
    """Reliability of an average of ``factor`` x as many repetitions as gave correlation ``r``."""
    if not np.isfinite(r):
        return float("nan")
    return float(factor * r / (1 + (factor - 1) * r))


def split_half(reps: np.ndarray, *, stat: Stat = spearman, n_splits: int = 50,
               seed: int = 0) -> float:
    """Spearman-Brown corrected split-half reliability of the mean over repetitions.

    ``reps`` is ``(units, repetitions)``; each split assigns half of the repetitions to each
    side at random, correlates the two half-means over units, and the mean correlation is
    stepped up to the full number of repetitions (``2r/(1+r)``).
    """
    reps = np.asarray(reps, float)
    if reps.ndim != 2 or reps.shape[1] < 2:
        raise ValueError(f"split_half needs (units, >= 2 repetitions), got shape {reps.shape}")
    rng = np.random.default_rng(seed)
    k = reps.shape[1]
    rs = []
    for _ in range(n_splits):
        perm = rng.permutation(k)
        a, b = perm[: k // 2], perm[k // 2: 2 * (k // 2)]
        rs.append(stat(reps[:, a].mean(1), reps[:, b].mean(1)))
    r = float(np.nanmean(rs))
    return spearman_brown(r, k / (k // 2))


def noise_ceiling(rel_truth: float, rel_pred: float) -> float:
    """Largest expected correlation of two measurements with these reliabilities."""
    if not (np.isfinite(rel_truth) and np.isfinite(rel_pred)):
        return float("nan")
    return math.sqrt(max(rel_truth, 0.0) * max(rel_pred, 0.0))
