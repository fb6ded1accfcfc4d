"""raysim.privacy.audit: Steinke, Nasr and Jagielski's one-run audit with canary clients."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from raysim.privacy.audit import (
    AuditResult,
    CanaryPlan,
    audit,
    canary_scores,
    correct,
    epsilon_lower_bound,
    guesses,
    p_value,
)

# --- independent references, written from the theorem's statement, not from the module ----------


def _expit(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _theorem_tail(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """f(v) + 2 m δ max_{i in 1..m} (f(v-i) - f(v)) / i, with f(u) = P[Binomial(r, q) >= u]."""
    q = _expit(eps)

    def f(u):
        return stats.binom.sf(np.asarray(u) - 1, r, q)  # P[B >= u]; 1 for u <= 0

    i = np.arange(1, m + 1)
    fv = float(f(v))
    return min(1.0, fv + 2 * m * delta * float(np.max((f(v - i) - fv) / i)))


def _root_bound(m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """The ε where the theorem's tail bound crosses 1 - confidence, by brentq."""
    beta = 1 - confidence
    if _theorem_tail(m, r, v, 0.0, delta) >= beta:
        return 0.0
    hi = 1.0
    while _theorem_tail(m, r, v, hi, delta) < beta:
        hi *= 2
    return optimize.brentq(
        lambda e: _theorem_tail(m, r, v, e, delta) - beta, 0.0, hi, xtol=1e-12, rtol=1e-12
    )


def _analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Balle & Wang 2018, Theorem 8: the Gaussian mechanism with sensitivity 1 and noise σ is
    (ε, δ)-DP iff Φ(1/(2σ) - εσ) - e^ε Φ(-1/(2σ) - εσ) <= δ; the smallest such ε."""

    def delta_of(eps: float) -> float:
        return stats.norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * stats.norm.cdf(
            -0.5 / sigma - eps * sigma
        )

    if delta_of(0.0) <= delta:
        return 0.0
    hi = 1.0
    while delta_of(hi) > delta:
        hi *= 2
    return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, hi, xtol=1e-12)


# --- the bound ------------------------------------------------------------------------------------


def test_bound_is_zero_at_chance_grows_with_correct_and_is_large_when_all_correct():
    m, r = 1000, 200
    assert epsilon_lower_bound(m, r, r // 2) == 0.0
    assert epsilon_lower_bound(m, r, r // 2, delta=1e-5) == 0.0
    assert epsilon_lower_bound(m, r, 0) == 0.0
    assert epsilon_lower_bound(m, 0, 0) == 0.0
    bounds = [epsilon_lower_bound(m, r, v, delta=1e-5) for v in range(0, r + 1, 5)]
    assert all(b2 >= b1 for b1, b2 in zip(bounds, bounds[1:], strict=False))
    assert bounds[-1] > bounds[-5] > bounds[-9] > 0.0
    # 2000 of 2000 guesses right: finite, and large (δ = 0: q^r = 0.05 at ε ≈ ln(r / ln 20) ≈ 6.5).
    top = epsilon_lower_bound(10_000, 2000, 2000)
    assert math.isfinite(top) and 6.0 < top < 7.5
    # δ > 0 can only weaken the bound; a higher confidence too.
    assert epsilon_lower_bound(10_000, 2000, 2000, delta=1e-6) < top
    assert epsilon_lower_bound(10_000, 2000, 2000, confidence=0.99) < top


def test_bound_matches_a_direct_binomial_tail_for_pure_dp():
    for m, r, v, conf in [(1000, 200, 140, 0.95), (500, 50, 45, 0.99), (10_000, 1000, 1000, 0.9)]:
        beta = 1 - conf
        want = optimize.brentq(
            lambda e, r=r, v=v, beta=beta: stats.binom.sf(v - 1, r, _expit(e)) - beta,
            0.0,
            50.0,
            xtol=1e-12,
        )
        got = epsilon_lower_bound(m, r, v, delta=0.0, confidence=conf)
        assert got == pytest.approx(want, abs=1e-8)
        # At the bound the tail is exactly 1 - confidence: rejected just below, not just above.
        assert p_value(m, r, v, got, 0.0) < beta <= p_value(m, r, v, got + 1e-6, 0.0)


def test_bound_matches_the_theorem_with_delta_evaluated_independently():
    for m, r, v, delta in [(1000, 100, 75, 1e-4), (2000, 300, 240, 1e-5), (200, 100, 90, 1e-3)]:
        assert epsilon_lower_bound(m, r, v, delta=delta) == pytest.approx(
            _root_bound(m, r, v, delta, 0.95), abs=1e-7
        )
        for eps in (0.0, 0.3, 1.0, 2.5):
            assert p_value(m, r, v, eps, delta) == pytest.approx(
                _theorem_tail(m, r, v, eps, delta), rel=1e-9, abs=1e-14
            )


def test_published_values():
    # Values printed in arXiv:2305.08846v1 as cited by a third-party port of Appendix D: the
    # Appendix D example (m = 1000, r = 100, v = 75, δ = 1e-4, 95%) gives 0.673, and Section 7's
    # best DP-SGD audit (m = 100000, r = 1510, v = 1439, δ = 1e-5, 95%) 2.675 (truncated).
    assert epsilon_lower_bound(1000, 100, 75, delta=1e-4) == pytest.approx(0.673, abs=1e-3)
    assert epsilon_lower_bound(100_000, 1510, 1439, delta=1e-5) == pytest.approx(2.675, abs=1e-3)


def test_bound_refuses_impossible_counts():
    for args in [(10, 11, 5), (10, 5, 6), (10, 5, -1)]:
        with pytest.raises(ValueError):
            epsilon_lower_bound(*args)
    with pytest.raises(ValueError):
        epsilon_lower_bound(10, 5, 5, delta=1.5)
    with pytest.raises(ValueError):
        epsilon_lower_bound(10, 5, 5, confidence=1.0)


# --- validity by simulation -----------------------------------------------------------------------


def _trial_counts(scores: np.ndarray, included: np.ndarray, k: int) -> tuple[int, int]:
    return correct(guesses(scores, k, k), included)


def test_randomised_response_is_never_overclaimed_and_is_nearly_tight():
    """ε0-DP per canary: each canary's inclusion bit is reported truthfully with probability
    e^ε0 / (1 + e^ε0). The bound may exceed ε0 in at most ~5% of runs (plus sampling slack)."""
    eps0, m, k, trials = 1.0, 1000, 100, 200
    keep = math.exp(eps0) / (1 + math.exp(eps0))
    rng = np.random.default_rng(20230515)
    bounds = []
    for _ in range(trials):
        included = rng.random(m) < 0.5
        flip = rng.random(m) >= keep
        scores = (included ^ flip).astype(float) + 1e-9 * rng.standard_normal(m)
        w, r = _trial_counts(scores, included, k)
        bounds.append(epsilon_lower_bound(m, r, w, delta=0.0, confidence=0.95))
    bounds = np.array(bounds)
    over = float(np.mean(bounds > eps0))
    assert over <= 0.05 + 0.04, over
    assert np.median(bounds) > 0.4 * eps0  # the mechanism is tight for this test: not vacuous


@pytest.mark.parametrize(
    ("eps0", "r", "delta"), [(1.0, 200, 0.0), (2.0, 100, 0.0), (0.5, 400, 1e-6)]
)
def test_randomised_response_exact_overclaim_probability(eps0, r, delta):
    """Guessing on randomised-response bits, each guess is right with probability
    e^ε0 / (1 + e^ε0) independently, so W ~ Binomial(r, that): the exact probability that the
    bound exceeds ε0 must be at most 1 - confidence, and (δ = 0, the tight case) close to it."""
    keep = math.exp(eps0) / (1 + math.exp(eps0))
    m = 5 * r
    over = sum(
        stats.binom.pmf(w, r, keep)
        for w in range(r + 1)
        if epsilon_lower_bound(m, r, w, delta=delta, confidence=0.95) > eps0
    )
    assert over <= 0.05
    if delta == 0.0:
        assert over > 0.03


@pytest.mark.parametrize(("sigma", "delta"), [(0.5, 1e-5), (2.0, 1e-5)])
def test_gaussian_mechanism_stays_below_its_analytic_epsilon(sigma, delta):
    """Each canary's score is included + N(0, σ²): the Gaussian mechanism with sensitivity 1."""
    eps_true = _analytic_gaussian_epsilon(sigma, delta)
    m, k, trials = 1000, 50, 200
    rng = np.random.default_rng(int(sigma * 1000))
    bounds = []
    for _ in range(trials):
        included = rng.random(m) < 0.5
        scores = included + sigma * rng.standard_normal(m)
        w, r = _trial_counts(scores, included, k)
        bounds.append(epsilon_lower_bound(m, r, w, delta=delta, confidence=0.95))
    bounds = np.array(bounds)
    assert float(np.mean(bounds > eps_true)) <= 0.05 + 0.04
    if sigma < 1:
        assert eps_true > 9.0
        assert np.median(bounds) > 2.0  # clearly above 0 when the noise is small


# --- the canary plan ------------------------------------------------------------------------------


def test_canary_plan_is_deterministic_and_half_included():
    a, b = CanaryPlan(20_000, 7), CanaryPlan(20_000, 7)
    assert np.array_equal(a.included(), b.included())
    assert not np.array_equal(a.included(), CanaryPlan(20_000, 8).included())
    inc = a.included()
    assert inc.dtype == np.bool_ and inc.shape == (20_000,)
    assert abs(inc.mean() - 0.5) < 4 * math.sqrt(0.25 / 20_000)
    with pytest.raises(ValueError):
        CanaryPlan(0, 1)
    with pytest.raises(ValueError):
        CanaryPlan(5, -1)


def test_directions_are_unit_reproducible_and_match_one_at_a_time():
    plan = CanaryPlan(40, 3)
    d = plan.directions(257)
    assert d.dtype == np.float32 and d.shape == (40, 257)
    assert np.allclose(np.linalg.norm(d.astype(np.float64), axis=1), 1.0, atol=1e-6)
    assert np.array_equal(d, CanaryPlan(40, 3).directions(257))
    for i in (0, 17, 39):
        assert np.array_equal(plan.direction(i, 257), d[i])
    assert not np.array_equal(d, CanaryPlan(40, 4).directions(257))
    gram = d.astype(np.float64) @ d.T.astype(np.float64) - np.eye(40)
    assert np.abs(gram).max() < 0.35  # random directions in 257 dims: nearly orthogonal
    with pytest.raises(IndexError):
        plan.direction(40, 257)


def test_directions_refuse_oversized_matrix_before_allocating():
    with pytest.raises(ValueError, match="max_bytes"):
        CanaryPlan(1000, 0).directions(1_000_000)  # 4 GB > the 2 GiB default
    with pytest.raises(ValueError, match="max_bytes"):
        CanaryPlan(10, 0).directions(100, max_bytes=3999)
    assert CanaryPlan(10, 0).directions(100, max_bytes=4000).shape == (10, 100)


# --- scores, guesses, counting --------------------------------------------------------------------


def test_canary_scores_are_cosines():
    plan = CanaryPlan(30, 11)
    dirs = plan.directions(64)
    rng = np.random.default_rng(0)
    delta = rng.standard_normal((8, 8))
    s = canary_scores(delta, dirs)
    flat = delta.ravel()
    assert np.allclose(s, dirs.astype(np.float64) @ flat / np.linalg.norm(flat), atol=1e-6)
    assert np.all(np.abs(s) <= 1.0)
    assert np.allclose(canary_scores(5.0 * delta, 3.0 * dirs), s)  # scale-free
    assert np.array_equal(canary_scores(np.zeros(64), dirs), np.zeros(30))
    with pytest.raises(ValueError):
        canary_scores(np.zeros(63), dirs)


def test_guesses_take_extremes_and_break_ties_by_index():
    scores = np.array([0.5, -1.0, 2.0, 0.1, 3.0, -2.0])
    g = guesses(scores, 2, 1)
    assert g.dtype == np.int8
    assert g.tolist() == [0, 0, 1, 0, 1, -1]
    assert guesses(np.zeros(10), 2, 3).tolist() == [-1, -1, -1, 0, 0, 0, 0, 0, 1, 1]
    assert guesses(np.zeros(4), 2, 2).tolist() == [-1, -1, 1, 1]
    assert not guesses(scores, 0, 0).any()
    with pytest.raises(ValueError):
        guesses(scores, 4, 3)


def test_correct_counts_right_guesses_and_ignores_abstentions():
    g = np.array([1, 1, -1, -1, 0, 0], dtype=np.int8)
    inc = np.array([True, False, False, True, True, False])
    assert correct(g, inc) == (2, 4)


# --- the whole audit ------------------------------------------------------------------------------


def test_audit_finds_canaries_in_a_model_change_and_not_in_noise():
    plan, dim = CanaryPlan(400, 5), 4000
    dirs = plan.directions(dim).astype(np.float64)
    inc = plan.included()
    rng = np.random.default_rng(1)
    change = dirs[inc].sum(axis=0) + 0.02 * rng.standard_normal(dim)
    res = audit(change.reshape(40, 100), plan, k_plus=50, k_minus=50, delta=1e-5)
    assert isinstance(res, AuditResult)
    assert (res.canaries, res.guesses, res.delta, res.confidence) == (400, 100, 1e-5, 0.95)
    assert res.correct == 100 and res.epsilon_lower_bound > 2.0
    scores = canary_scores(change, plan.directions(dim))
    w, r = correct(guesses(scores, 50, 50), inc)
    assert (w, r) == (res.correct, res.guesses)
    metrics = res.as_metrics()
    assert set(metrics) == {
        "dp_audit_canaries",
        "dp_audit_guesses",
        "dp_audit_correct",
        "dp_audit_delta",
        "dp_audit_confidence",
        "dp_audit_epsilon_lower_bound",
    }
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["dp_audit_epsilon_lower_bound"] == res.epsilon_lower_bound

    null = audit(rng.standard_normal(dim), plan, k_plus=50, k_minus=50, delta=1e-5)
    assert null.guesses == 100 and null.epsilon_lower_bound < 0.5
