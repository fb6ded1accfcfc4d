"""Model-poisoning attacks that read the round's benign updates (an omniscient attacker).

Each takes ``honest``, the (h, d) array of the round's benign updates ordered by client id, and
returns the one (d,) float32 update that every malicious client of the round sends (the papers'
attackers collude: they all send it). They see what a real attacker could not: every benign
update of the round, before the server aggregates it; the papers evaluate this strongest
attacker, and so does raysim.

- ``ipm``: −ε·mean (Xie, Koyejo, Gupta 2019, "Fall of Empires", §4).
- ``alie``: mean + z·std per coordinate (Baruch, Baruch, Goldberg 2019, "A Little Is Enough",
  Algorithm 3), std with ddof 1; z by default the paper's z_max = Φ⁻¹((n − s)/n) with
  s = ⌊n/2 + 1⌋ − f (at least 1), for n updates of which f are malicious.
- ``min_max`` / ``min_sum``: mean + γ·p (Shejwalkar, Houmansadr 2021, "Manipulating the
  Byzantine", §IV, Algorithm 1) with the largest γ found by their halving search such that the
  malicious update's largest distance to a benign one (min-max) or its sum of squared distances
  to them (min-sum) stays within the largest such value among the benign updates; the
  perturbation p is −std (``std``, default), −mean/‖mean‖ (``unit``) or −sign(mean) (``sign``).
- ``sign_flip`` with ``of: mean``: −scale·mean (byzfl's SignFlipping); with ``of: own`` (default)
  each malicious client negates its own update, which needs no other update (a client-side
  behaviour).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import norm

from . import rules


def _mean(honest: np.ndarray) -> np.ndarray:
    return rules.weighted_rows(honest, np.full(len(honest), 1.0 / len(honest)))


def _std(honest: np.ndarray) -> np.ndarray:
    """Per coordinate, ddof 1, float64."""
    return rules.by_columns(honest, lambda c: c.std(axis=0, ddof=1)).astype(np.float64)


def ipm(honest: np.ndarray, epsilon: float) -> np.ndarray:
    return (-epsilon * _mean(honest)).astype(np.float32)


def sign_flip_mean(honest: np.ndarray, scale: float = 1.0) -> np.ndarray:
    return (-scale * _mean(honest)).astype(np.float32)


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s z_max for n updates of which f are malicious; s, the benign updates the
    attackers need on their side, is at least 1 (where the attackers are a majority of the
    round, the paper's s ≤ 0 would make z infinite)."""
    s = max(math.floor(n / 2 + 1) - f, 1)
    return float(norm.ppf((n - s) / n))


def alie(honest: np.ndarray, z: float) -> np.ndarray:
    return rules.by_columns(honest, lambda c: c.mean(axis=0) + z * c.std(axis=0, ddof=1))


def perturbation(honest: np.ndarray, kind: str) -> np.ndarray:
    """Shejwalkar and Houmansadr's perturbation directions (``std``, ``unit``, ``sign``)."""
    if kind == "std":
        return -_std(honest)
    mean = _mean(honest)
    if kind == "unit":
        return -mean / max(np.linalg.norm(mean), 1e-30)
    return -np.sign(mean)


def _largest_gamma(fits, gamma: float = 10.0, tolerance: float = 1e-5) -> float:
    """Algorithm 1's search: from γ_init, move by half the last step (up after a γ that
    ``fits``, down after one that does not) until γ is within ``tolerance`` of the last γ that
    fit; that γ (0 if none did)."""
    fitted, step = 0.0, gamma
    while abs(fitted - gamma) > tolerance:
        if fits(gamma):
            fitted = gamma
            gamma += step / 2
        else:
            gamma -= step / 2
        step /= 2
    return fitted


def _spread(honest: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The benign mean μ, and per benign update ‖x_i − μ‖² and ⟨x_i − μ, p⟩: then
    ‖x_i − (μ + γp)‖² = a_i − 2γ·b_i + γ²‖p‖² for any γ, in O(h)."""
    mean = _mean(honest)
    a, b = np.zeros(len(honest)), np.zeros(len(honest))
    for part, chunk in rules.columns(honest):
        centred = chunk - mean[part]
        a += (centred**2).sum(axis=1)
        b += centred @ p[part]
    return mean, a, b


def min_max(honest: np.ndarray, kind: str = "std", gamma: float = 10.0) -> np.ndarray:
    p = perturbation(honest, kind)
    mean, a, b = _spread(honest, p)
    pp = float(p @ p)
    bound = rules.squared_distances(honest).max()

    def fits(g: float) -> bool:
        return float((a - 2 * g * b + g * g * pp).max()) <= bound

    return (mean + _largest_gamma(fits, gamma) * p).astype(np.float32)


def min_sum(
    honest: np.ndarray, kind: str = "std", gamma: float = 10.0, bound: str = "max"
) -> np.ndarray:
    """``bound``: the benign updates' largest sum of squared distances (``max``, the paper's
    formulation) or their smallest (``min``, a stricter attacker)."""
    p = perturbation(honest, kind)
    mean, a, b = _spread(honest, p)
    pp = float(p @ p)
    sums = rules.squared_distances(honest).sum(axis=1)
    limit = sums.max() if bound == "max" else sums.min()

    def fits(g: float) -> bool:
        return float((a - 2 * g * b + g * g * pp).sum()) <= limit

    return (mean + _largest_gamma(fits, gamma) * p).astype(np.float32)


def gaussian(rng: np.random.Generator, d: int, mu: float = 0.0, sigma: float = 1.0) -> np.ndarray:
    """N(μ, σ²) per coordinate (byzfl's Gaussian; the Gaussian attack of Blanchard et al. 2017,
    §5), from ``rng``: it needs no other update (a client-side behaviour)."""
    return rng.normal(mu, sigma, size=d).astype(np.float32)
