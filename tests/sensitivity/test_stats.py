"""Statistics helpers of the sensitivity validation: rank correlations, bootstrap intervals,
split-half reliability, noise ceiling.

Tolerances: every ``approx`` here compares float64 arithmetic on the same numbers summed in
another order (an ILP's objective against brute force's, a fraction of integer FLOPs, a JSON
round trip); Python floats round the same on every CPU, so ``rel=1e-9`` (or approx's default
1e-6) is millions of times wider than the ~n x 2^-53 such a sum can differ by.  The split-half
reliability (``abs=0.06``) is
a statistic of seeded numpy draws: the same draws on every machine, the tolerance is its
sampling error for the known answer."""

import math

import numpy as np
import pytest
from scipy import stats as st

from snip.sensitivity import stats as S


def test_kendall_counts_concordant_pairs():
    # 4 items, one swapped pair: 5 concordant, 1 discordant -> tau = 4/6
    assert S.kendall([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert S.kendall([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(S.kendall([1, 1, 1], [1, 2, 3]))


def test_spearman_matches_rank_pearson():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=30), rng.normal(size=30)
    ra, rb = st.rankdata(a), st.rankdata(b)
    assert S.spearman(a, b) == pytest.approx(np.corrcoef(ra, rb)[0, 1])
    assert S.spearman(a, np.exp(a)) == pytest.approx(1.0)


def test_bootstrap_ci_covers_known_correlation_and_shrinks_with_n():
    rng = np.random.default_rng(1)
    rho = 0.8  # Gaussian correlation; Spearman = 6/pi asin(rho/2) ~ 0.786

    def sample(n):
        x = rng.normal(size=n)
        return x, rho * x + math.sqrt(1 - rho**2) * rng.normal(size=n)
    target = 6 / math.pi * math.asin(rho / 2)
    small = S.bootstrap_ci(S.spearman, *sample(40), n_boot=500)
    big = S.bootstrap_ci(S.spearman, *sample(2000), n_boot=300)
    assert small.low < target < small.high
    assert big.low < target < big.high
    assert big.high - big.low < (small.high - small.low) / 3
    assert small.low < small.value < small.high and small.n == 40


def test_bootstrap_ci_strata_average_per_stratum():
    # stratum 0 perfectly ranked, stratum 1 perfectly reversed -> mean 0, not the pooled value
    a = np.r_[np.arange(10), 10 + np.arange(10)]
    b = np.r_[np.arange(10), 100 - np.arange(10)]
    iv = S.bootstrap_ci(S.spearman, a, b, strata=[0] * 10 + [1] * 10, n_boot=100)
    assert iv.value == pytest.approx(0.0)
    assert abs(S.bootstrap_ci(S.spearman, a, b, n_boot=10).value) > 0.05


def test_paired_difference_detects_better_predictor():
    rng = np.random.default_rng(2)
    truth = rng.normal(size=60)
    good = truth + 0.2 * rng.normal(size=60)
    bad = truth + 2.0 * rng.normal(size=60)
    d = S.paired_difference_ci(S.spearman, good, bad, truth, n_boot=500)
    assert d.value == pytest.approx(S.spearman(good, truth) - S.spearman(bad, truth))
    assert d.low > 0
    same = S.paired_difference_ci(S.spearman, good, good, truth, n_boot=50)
    assert same.value == same.low == same.high == 0.0


def test_spearman_brown_and_split_half_recover_reliability():
    assert S.spearman_brown(0.5) == pytest.approx(2 / 3)
    assert S.spearman_brown(0.5, 4) == pytest.approx(0.8)
    rng = np.random.default_rng(3)
    units, reps, noise = 400, 8, 2.0
    signal = rng.normal(size=units)
    m = signal[:, None] + noise * rng.normal(size=(units, reps))
    # true reliability of the mean of 8: var(s) / (var(s) + noise^2 / 8) = 1 / 1.5
    rel = S.split_half(m, stat=S.pearson, n_splits=20)
    assert rel == pytest.approx(1 / 1.5, abs=0.06)
    with pytest.raises(ValueError):
        S.split_half(m[:, :1])


def test_noise_ceiling():
    assert S.noise_ceiling(0.81, 1.0) == pytest.approx(0.9)
    assert S.noise_ceiling(-0.2, 0.5) == 0.0
    assert math.isnan(S.noise_ceiling(float("nan"), 0.5))
