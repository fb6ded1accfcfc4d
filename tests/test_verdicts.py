"""``raysim.verdicts``: the statistics every paper's report decides its claims with (issues 45,
62)."""

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
    s = Summary.of([0.80, 0.90, 1.00], higher_is_better=True)
    assert s.mean == pytest.approx(0.9) and s.sd == pytest.approx(0.1)  # ddof = 1, not 0.0816
    assert s.best == 1.0 and s.n == 3
    assert Summary.of([0.3, 0.2], higher_is_better=False).best == 0.2
    assert Summary.of([0.5], higher_is_better=True).sd == 0.0
    assert s.text(scale=100) == "90.0 ± 10.0 (best 100.0, n = 3)"
    with pytest.raises(ValueError):
        Summary.of([], higher_is_better=True)
    with pytest.raises(TypeError):  # "best" needs the metric's direction, named by the caller
        Summary.of([0.3, 0.2])  # type: ignore[call-arg]


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
    clear = Paired.of([0.5, 0.7, 0.9], [0.40, 0.59, 0.81])  # differences 0.1, 0.11, 0.09
    assert clear.low > 0 and clear.interval_verdict == HELD  # the interval alone would decide
    assert clear.p == 1 / 8 and clear.verdict == INCONCLUSIVE  # 3 seeds never reach p ≤ 0.05
    assert "the interval alone: held" in clear.text()
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


def test_five_seeds_decide_only_when_every_difference_lies_on_the_claimed_side():
    """Issue 62, item 7: held needs the interval and an exact p ≤ 0.05; one seed of five on the
    other side makes p = 2/32 however clear the interval."""
    base = np.array([80.0, 81.0, 82.0, 83.0, 84.0])
    assert Paired.of(base + [3, 4, 5, 6, 7], base).verdict == HELD
    one_below = Paired.of(base + [9, 9, 9, 9, -0.1], base)
    assert one_below.low > 0 and one_below.p == 2 / 32
    assert one_below.verdict == INCONCLUSIVE and one_below.interval_verdict == HELD
    refuted = Paired.of(base - [3, 4, 5, 6, 7], base)
    assert refuted.verdict == NOT_HELD and refuted.p == 1.0  # the opposite side's p is 1/32


def test_no_information_decides_nothing():
    """Issue 62, items 5 and 6: a zero-width interval, a NaN in a seed and a constant series are
    inconclusive, and say why, where they used to print held and p = 0."""
    same = Paired.of([3.0, 4.0, 5.0, 6.0, 7.0], [2.0, 3.0, 4.0, 5.0, 6.0])  # +1 in every seed
    assert same.low == same.high == 1.0 and same.p == 1 / 32
    assert same.verdict == INCONCLUSIVE and same.interval_verdict == HELD
    assert same.why and same.within(5.0) == INCONCLUSIVE
    nan = Paired.of([3.0, float("nan"), 5.0], [1.0, 1.0, 1.0])
    assert nan.verdict == INCONCLUSIVE and np.isnan(nan.p) and "NaN in 1 of 3 seeds" in nan.text()
    flat = Correlation.of(np.arange(6.0), np.full(6, 0.7))
    assert flat.verdict == INCONCLUSIVE and np.isnan(flat.rho) and "constant" in flat.text()
    assert Correlation.of(np.full(6, 2.0), np.arange(6.0)).verdict == INCONCLUSIVE


def test_a_sampled_permutation_p_value_is_never_zero():
    x = np.arange(19.0)
    exact_fall = Correlation.of(x, -x)
    assert exact_fall.rho == pytest.approx(-1.0)
    assert exact_fall.p == pytest.approx(1 / 20_001)  # (k + 1)/(N + 1), k = 0


def test_closeness_is_two_one_sided_tests():
    """Issue 62, item 9: "|a − b| < bound" uses the 90 % interval and the larger of the two
    one-sided sign-flip p-values, which say something about closeness."""
    a = np.array([90.0, 91.0, 89.5, 90.5, 90.2])
    b = np.array([90.5, 90.0, 90.0, 91.0, 90.0])
    near = Paired.of(a, b)
    low, high, p = near.tost(5.0)
    d = a - b
    half = stats.t.ppf(0.95, 4) * d.std(ddof=1) / np.sqrt(5)
    assert (low, high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert p == 1 / 32 and near.within(5.0) == HELD
    # inside the bound on the 95 % interval's reading, but one seed beyond it: p = 2/32
    edge = Paired.of(b + [0.5, 0.5, 0.5, 0.5, 5.5], b)
    assert edge.tost(5.0)[2] == 2 / 32 and edge.within(5.0) == INCONCLUSIVE
    assert "TOST p = 0.0312" in near.within_text(5.0)
    three = Paired.of(a[:3], b[:3])  # 3 seeds: TOST's smallest p is 1/8
    assert three.within(5.0) == INCONCLUSIVE


def test_by_seed_pairs_named_seeds_not_positions():
    """Issue 62, item 9: Feddle paired seeds by position; a run that lacks a seed or lists them in
    another order must not pair two different seeds."""
    a = {0: 0.90, 1: 0.80, 2: 0.70, 3: 0.95}
    b = {2: 0.60, 0: 0.85, 1: 0.75}  # another order, and no seed 3
    paired = Paired.by_seed(a, b)
    assert paired.n == 3 and paired.differences == pytest.approx((0.05, 0.05, 0.10))
