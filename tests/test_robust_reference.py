"""raysim's robust rules and attacks (``raysim.robust``) against byzfl's on the same inputs.

byzfl (requirements-reference.txt, installed by ``make`` without its dependencies) is loaded
without its package ``__init__``, which imports its benchmark and so torchvision; its
aggregators and attacks need numpy, torch and scipy only. Where a rule's paper differs from
byzfl, raysim follows the paper by default and takes byzfl's reading through a switch; the test
checks the switch against byzfl and the default against the paper's definition. Bulyan, min-max
and min-sum are not in byzfl: Bulyan is checked against byzfl's Krum and Meamed composed as the
paper composes them, min-max and min-sum against their defining constraints.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
import types

import numpy as np
import pytest

from raysim.robust import attacks, rules


def _byzfl():
    """byzfl's aggregators, pre-aggregators and attacks modules, without its package init."""
    spec = importlib.util.find_spec("byzfl")
    assert spec is not None, "byzfl is not installed: make installs requirements-reference.txt"
    if "byzfl" not in sys.modules:
        package = types.ModuleType("byzfl")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["byzfl"] = package
    from byzfl.aggregators import aggregators, preaggregators
    from byzfl.attacks import attacks as byz_attacks

    return aggregators, preaggregators, byz_attacks


AGG, PRE, ATT = _byzfl()


def updates(n: int, d: int = 40, seed: int = 0, outliers: int = 0) -> np.ndarray:
    """n updates around a common mean; the last ``outliers`` far off."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.5, 1.0, size=(n, d))
    x[n - outliers :] += rng.normal(8.0, 3.0, size=(outliers, d))
    return x


def close(ours: np.ndarray, theirs) -> None:
    np.testing.assert_allclose(ours, np.asarray(theirs, dtype=np.float64), rtol=2e-6, atol=2e-6)


CASES = [(7, 1, 0), (8, 1, 1), (11, 2, 2), (16, 3, 3), (21, 4, 4)]


@pytest.mark.parametrize("n,f,bad", CASES)
def test_median_and_trimmed_mean_are_byzfls(n, f, bad):
    x = updates(n, outliers=bad)
    close(rules.median(x), AGG.Median()(x))  # n even: the mean of the two middle values
    close(rules.trimmed_mean(x, f), AGG.TrMean(f=f)(x))


@pytest.mark.parametrize("n,f,bad", CASES)
def test_krum_and_multi_krum_with_byzfls_neighbours_are_byzfls(n, f, bad):
    x = updates(n, seed=n, outliers=bad)
    close(rules.krum(x, f, neighbours="byzfl"), AGG.Krum(f=f)(x))
    close(rules.krum(x, f, m=n - f, neighbours="byzfl"), AGG.MultiKrum(f=f)(x))


@pytest.mark.parametrize("n,f,bad", CASES)
def test_krum_by_default_scores_the_papers_n_minus_f_minus_2_neighbours(n, f, bad):
    """Blanchard et al. §4: s(i) = Σ over the n − f − 2 closest; brute force over subsets."""
    x = updates(n, seed=n + 1, outliers=bad)
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    scores = [
        min(sum(d[i, j] for j in near) for near in itertools.combinations(
            [j for j in range(n) if j != i], n - f - 2))
        for i in range(n)
    ] if n <= 11 else np.sort(d + np.diag([np.inf] * n), axis=1)[:, : n - f - 2].sum(1)  # fmt: skip
    close(rules.krum(x, f), x[int(np.argmin(scores))])
    m = 3
    close(rules.krum(x, f, m=m), x[np.sort(np.argsort(scores)[:m])].mean(0))


@pytest.mark.parametrize("n,f,bad", [(7, 1, 1), (11, 2, 2), (15, 3, 3), (15, 2, 2)])
def test_bulyan_is_byzfls_krum_repeated_then_its_meamed(n, f, bad):
    """El Mhamdi et al.'s Algorithm 1 from byzfl's parts: θ = n − 2f picks of Krum, each among
    the updates not yet picked, then Meamed with 2f (the β = θ − 2f values nearest the
    median)."""
    x = updates(n, seed=2 * n, outliers=bad)
    left, chosen = list(range(n)), []
    for _ in range(n - 2 * f):
        pick = np.asarray(AGG.Krum(f=f)(x[left]))
        row = next(j for j in left if np.array_equal(x[j], pick))
        chosen.append(row)
        left.remove(row)
    s = x[sorted(chosen)]
    if len(s) > 4 * f:  # byzfl's Meamed takes 2f' < θ only
        expected = AGG.Meamed(f=2 * f)(s)
    else:  # the same by hand: per coordinate, the β values nearest the median, averaged
        beta, centre = len(s) - 2 * f, np.median(s, axis=0)
        expected = np.array([sorted(c, key=lambda v, m=m: abs(v - m))[:beta]
                             for c, m in zip(s.T, centre, strict=True)]).mean(1)  # fmt: skip
    close(rules.bulyan(x, f, neighbours="byzfl"), expected)


@pytest.mark.parametrize("n,bad", [(7, 0), (10, 2), (16, 5)])
def test_geometric_median_from_the_origin_is_byzfls(n, bad):
    x = updates(n, seed=3 * n, outliers=bad)
    ours = rules.geometric_median(x, nu=0.1, iterations=3, tolerance=0.0, init="zero")
    close(ours, AGG.GeometricMedian(nu=0.1, T=3)(x))


def test_geometric_median_by_default_converges_to_weiszfelds_fixed_point():
    """RFA: from the weighted mean until it settles; the result minimises Σ α_i ‖v − x_i‖."""
    x = updates(12, outliers=3)
    w = np.arange(1.0, 13.0)
    v = rules.geometric_median(x, weights=w, iterations=1000, tolerance=1e-12).astype(float)

    def cost(z):
        return float((w * np.linalg.norm(x - z, axis=1)).sum())

    rng = np.random.default_rng(1)
    assert all(cost(v) <= cost(v + 1e-3 * rng.normal(size=v.shape)) for _ in range(50))


@pytest.mark.parametrize("n,iterations,tau", [(7, 1, 1.0), (10, 3, 0.5), (16, 5, 20.0)])
def test_centered_clipping_is_byzfls(n, iterations, tau):
    x = updates(n, seed=n, outliers=2)
    ours = rules.centered_clipping(x, np.zeros(x.shape[1]), tau, iterations)
    close(ours, AGG.CenteredClipping(L=iterations, tau=tau)(x))


def test_norm_bound_is_byzfls_static_clipping():
    x = updates(9, outliers=3)
    ours = np.stack([rules.norm_bound(v.astype(np.float32), 6.0) for v in x]).mean(0)
    theirs = AGG.Average()(PRE.Clipping(c=6.0)(x.copy()))
    close(ours, theirs)


@pytest.mark.parametrize("n", [5, 12])
def test_ipm_alie_and_mean_sign_flip_are_byzfls(n):
    x = updates(n, seed=n)
    close(attacks.ipm(x, 0.5), ATT.InnerProductManipulation(tau=0.5)(x))
    close(attacks.alie(x, 1.5), ATT.ALittleIsEnough(tau=1.5)(x))
    close(attacks.sign_flip_mean(x), ATT.SignFlipping()(x))


def test_alie_z_max_is_the_papers():
    """Baruch et al.'s formula: n = 50, f = 12 gives s = 14, z_max = Φ⁻¹(36/50) ≈ 0.58."""
    assert attacks.alie_z(50, 12) == pytest.approx(0.5828, abs=1e-4)
    assert attacks.alie_z(10, 2) == pytest.approx(0.2533, abs=1e-4)  # s = 4, Φ⁻¹(0.6)
    # attackers a majority of the round: s would be ≤ 0 and z infinite; s is held at 1
    assert attacks.alie_z(20, 11) == attacks.alie_z(20, 14) == pytest.approx(1.6449, abs=1e-4)


def test_gaussian_attack_draws_what_byzfls_does():
    """Both draw N(μ, σ²) per coordinate (from different streams): the same moments."""
    rng = np.random.default_rng(0)
    np.random.seed(0)
    theirs = ATT.Gaussian(mu=0.3, sigma=2.0)(updates(5, d=200_000))
    ours = attacks.gaussian(rng, 200_000, mu=0.3, sigma=2.0)
    for sample in (ours, theirs):
        assert abs(sample.mean() - 0.3) < 0.02 and abs(sample.std() - 2.0) < 0.02


@pytest.mark.parametrize("kind", ["std", "unit", "sign"])
@pytest.mark.parametrize("attack", ["min_max", "min_sum"])
def test_min_max_and_min_sum_find_the_largest_gamma_their_constraint_allows(attack, kind):
    """Shejwalkar and Houmansadr §IV: the malicious update mean + γ·p stays within the benign
    updates' largest distance (min-max) or sum of squared distances (min-sum), and γ is the
    largest that does, to the search's tolerance."""
    x = updates(15, seed=4)
    mal = getattr(attacks, attack)(x, kind).astype(np.float64)
    mean, p = x.mean(0), attacks.perturbation(x, kind)
    gamma = float(np.dot(mal - mean, p) / np.dot(p, p))
    assert gamma > 0
    d = rules.squared_distances(x)

    def value(g):
        m = mean + g * p
        s = ((x - m) ** 2).sum(1)
        return s.max() if attack == "min_max" else s.sum()

    bound = d.max() if attack == "min_max" else d.sum(1).max()
    assert value(gamma) <= bound * (1 + 1e-9)
    assert value(gamma + 1e-3) > bound


def test_chunks_of_coordinates_change_no_rule_or_attack(monkeypatch):
    """The rules work on CHUNK coordinates at a time (memory at 10^6 parameters): chunks of 7
    of 40 coordinates (a partial last one) give what one chunk gives."""
    x = updates(11, outliers=2)
    centre = np.linspace(-1, 1, 40)

    def everything():
        return [
            rules.krum(x, 2), rules.krum(x, 2, m=5), rules.median(x), rules.trimmed_mean(x, 2),
            rules.bulyan(x, 2), rules.geometric_median(x, np.arange(1.0, 12.0)),
            rules.centered_clipping(x, centre, 1.0, 3), attacks.ipm(x, 0.5), attacks.alie(x, 1.0),
            attacks.min_max(x), attacks.min_sum(x, "unit"), attacks.sign_flip_mean(x),
        ]  # fmt: skip

    whole = everything()
    monkeypatch.setattr(rules, "CHUNK", 7)
    for a, b in zip(whole, everything(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
