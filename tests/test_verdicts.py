"""``raysim.verdicts``: the statistics every paper's report decides its claims with (issue 45)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from raysim.verdicts import (
    HELD,
    INCONCLUSIVE,
    NOT_HELD,
    Correlation,
    Paired,
    Summary,
    all_of,
    sign_flip_p,
)


def test_a_cell_is_its_mean_and_sample_standard_deviation():
    s = Summary.of([0.80, 0.90, 1.00])
    assert s.mean == pytest.approx(0.9) and s.sd == pytest.approx(0.1)  # ddof = 1, not 0.0816
    assert s.best == 1.0 and s.n == 3
    assert Summary.of([0.3, 0.2], higher_is_better=False).best == 0.2
    assert Summary.of([0.5]).sd == 0.0
    assert s.text(scale=100) == "90.0 ± 10.0 (best 100.0, n = 3)"
    with pytest.raises(ValueError):
        Summary.of([])


def test_sign_flips_are_exact():
    assert sign_flip_p([1.0, 2.0, 3.0]) == 1 / 8  # only the observed signs are as large
    assert sign_flip_p([1.0, 2.0, 3.0, 4.0, 5.0]) == 1 / 32
    assert sign_flip_p([1.0, 2.0, 3.0], greater=False) == 1.0
    # 3, −1: the means of (±3 ± 1)/2 are 2, 1, −1, −2; the observed 1 or more: 2 of 4
    assert sign_flip_p([3.0, -1.0]) == 0.5
    assert sign_flip_p([0.0, 0.0, 0.0]) == 1.0


def test_the_interval_is_student_s_and_decides_the_verdict():
    a, b = np.array([0.5, 0.7, 0.9]), np.array([0.4, 0.5, 0.6])  # differences 0.1, 0.2, 0.3
    paired = Paired.of(a, b)
    low, high = stats.t.interval(0.95, 2, loc=0.2, scale=0.1 / np.sqrt(3))
    assert (paired.low, paired.high) == pytest.approx((low, high))
    assert paired.low < 0 < paired.high and paired.verdict == INCONCLUSIVE  # 3 seeds: too few
    assert paired.p == 1 / 8
    five = Paired.of([90, 91, 92, 93, 94], [80, 80.5, 82, 81, 83])
    assert five.verdict == HELD and five.p == 1 / 32
    assert Paired.of([80, 80.5, 82, 81, 83], [90, 91, 92, 93, 94]).verdict == NOT_HELD
    # "a is within 5 points of b", i.e. a − b > −5: held only when the interval clears −5
    close = Paired.of([88, 89, 90, 91, 92], [90, 90, 91, 92, 93], margin=-5.0)
    assert close.verdict == HELD and close.mean == pytest.approx(-1.2)
    assert Paired.of([1.0, 2.0], [1.0, 2.0]).verdict == INCONCLUSIVE  # no difference at all
    with pytest.raises(ValueError):
        Paired.of([1.0], [0.0])


def test_a_gap_smaller_than_its_noise_is_inconclusive_not_a_failed_claim():
    """FedBaF's claim 3 was called "did not hold" on a 2.3-point gap against standard deviations
    of about 11 over 3 seeds: the seeds cannot tell either way."""
    rng = np.random.default_rng(0)
    base = rng.normal(30, 11, 3)
    paired = Paired.of(base - 2.3 + rng.normal(0, 1, 3), base, greater=False)
    assert paired.verdict in (INCONCLUSIVE, HELD)
    noisy = Paired.of(rng.normal(28, 11, 3), rng.normal(30, 11, 3), greater=False)
    assert noisy.verdict == INCONCLUSIVE


def test_correlations_are_decided_by_an_exact_permutation_test():
    x = np.arange(8.0)
    falls = Correlation.of(x, -x + 0.01 * np.sin(x))
    assert falls.rho == pytest.approx(-1.0) and falls.p == pytest.approx(2 / 40320)
    assert falls.verdict == HELD
    assert Correlation.of(x, x).verdict == NOT_HELD  # it rises: the claimed fall is refuted
    rng = np.random.default_rng(1)
    weak_x, weak_y = rng.normal(size=19), rng.normal(size=19)
    weak = Correlation.of(weak_x, weak_y)
    assert weak.verdict == INCONCLUSIVE and weak.p > 0.05
    rho, p = stats.spearmanr(weak_x, weak_y)
    assert weak.rho == pytest.approx(rho) and weak.p == pytest.approx(p, abs=0.03)


def test_closeness_is_held_only_inside_the_bound_and_refuted_only_outside_it():
    """FedBaF's claim 2 ("within a few points of weight-init") as an interval inside ±5."""
    near = Paired.of([90.0, 91.0, 89.5, 90.5, 90.2], [90.5, 90.0, 90.0, 91.0, 90.0])
    assert near.within(5.0) == HELD and near.within(0.05) == INCONCLUSIVE
    far = Paired.of([80.0, 81.0, 79.5, 80.5, 80.2], [90.5, 90.0, 90.0, 91.0, 90.0])
    assert far.within(5.0) == NOT_HELD  # the whole interval below −5
    straddles = Paired.of([86.0, 92.0, 84.0, 90.0, 85.0], [90.5, 90.0, 90.0, 91.0, 90.0])
    assert straddles.low < -5 < straddles.high and straddles.within(5.0) == INCONCLUSIVE


def test_a_claim_of_parts_needs_every_part():
    assert all_of([HELD, HELD]) == HELD
    assert all_of([HELD, INCONCLUSIVE]) == INCONCLUSIVE
    assert all_of([INCONCLUSIVE, NOT_HELD, HELD]) == NOT_HELD
    with pytest.raises(ValueError):
        all_of([])
