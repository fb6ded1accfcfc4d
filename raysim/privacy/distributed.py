"""Accounting for distributed DP: integer noise added by the clients inside secure aggregation
(``privacy.secure_aggregation.noise``), so that the sum the server unmasks carries it.

The sum's noise is Skellam (Agarwal, Kairouz and Liu, *The Skellam Mechanism for Differentially
Private Federated Learning*, NeurIPS 2021, https://arxiv.org/abs/2110.04995) or a sum of
discrete Gaussians (Kairouz, Liu and Steinke, *The Distributed Discrete Gaussian Mechanism for
Federated Learning with Secure Aggregation*, ICML 2021, https://arxiv.org/abs/2102.06387). Neither
is a Gaussian, so dp-accounting's events do not describe them; their Rényi-DP curves are written
here, in the encoded domain's integer units:

- sensitivity: a delta clipped to C and rounded to the grid (``rint(x·2^f)``, each coordinate
  moved by at most ½) has ``Δ₂ ≤ C·2^f + √d/2``; integers have ``Δ₁ ≤ min(√d·Δ₂, Δ₂²)``;
  replacing one client (fixed-size sampling) doubles both;
- Skellam of variance μ (Agarwal et al. 2021, Corollary 3.6 for integer α > 1):
  ``ε(α) = αΔ₂²/(2μ) + min(((2α−1)Δ₂² + 6Δ₁)/(4μ²), 3Δ₁/(2μ))``;
- n discrete Gaussians of variance σ² each (Kairouz et al. 2021, Proposition 14), with
  ``τ = 10·Σ_{k<n} exp(−2π²σ²·k/(k+1))`` bounded here by ``10(n−1)·exp(−π²σ²)`` and
  ``s₂ = Δ₂/√(nσ²)``, ``s₁ = Δ₁/√(nσ²)``:
  ``ε(α) = min(α s₂²/2 + τd, α(s₂² + 2s₁τ + τ²d)/2, α(s₂ + τ√d)²/2)``.

Amplification by sampling, for a mechanism known only by its RDP curve ε(·):

- Poisson (add or remove one): Zhu and Wang, *Poisson Subsampled Rényi Differential Privacy*
  (ICML 2019, http://proceedings.mlr.press/v97/zhu19c.html), Theorem 6's general upper bound;
- fixed size without replacement (replace one): Wang, Balle and Kasiviswanathan, *Subsampled
  Rényi Differential Privacy and Analytical Moments Accountant* (AISTATS 2019,
  https://arxiv.org/abs/1808.00087), Theorem 9 with ε(∞) = ∞.

These are general bounds, looser than dp-accounting's exact analysis of the sampled Gaussian; a
test holds them above it (for the Gaussian's own curve) and close to it. Composition adds RDP;
ε(δ) comes from dp-accounting's ``compute_epsilon`` (the conversion its RDP accountant uses).
numpy and scipy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.special import gammaln, logsumexp

from .accounting import Schedule, TargetNotReachable

Kind = Literal["skellam", "discrete_gaussian"]
#: integer Rényi orders (the curves above hold for integer α > 1)
ORDERS = np.array([*range(2, 129), 160, 192, 256], dtype=np.float64)


@dataclass(frozen=True)
class IntegerNoise:
    """One aggregation's distributed noise, as the accountant sees it.

    ``dim``: d, the entries of a delta; ``clip_units``: C·2^f; ``noise_multiplier``: z, so the
    unmasked sum's noise has variance at least (z·C·2^f)² in units; ``max_shares``: the most
    clients whose noise shares one sum can hold (S for fixed-size sampling; N for Poisson), for
    the discrete Gaussians' τ."""

    kind: Kind
    dim: int
    clip_units: float
    noise_multiplier: float
    max_shares: int

    def sensitivities(self, replace_one: bool) -> tuple[float, float]:
        """(Δ₁, Δ₂) of a clipped, rounded delta in units; doubled for replace-one."""
        l2 = self.clip_units + math.sqrt(self.dim) / 2
        l1 = l2 * min(math.sqrt(self.dim), l2)
        k = 2.0 if replace_one else 1.0
        return k * l1, k * l2

    def rdp(self, alpha: int, replace_one: bool) -> float:
        """ε(α) of one unsampled release."""
        l1, l2 = self.sensitivities(replace_one)
        variance = (self.noise_multiplier * self.clip_units) ** 2
        if self.kind == "skellam":
            quartic = ((2 * alpha - 1) * l2**2 + 6 * l1) / (4 * variance**2)
            extra = min(quartic, 3 * l1 / (2 * variance))
            return alpha * l2**2 / (2 * variance) + extra
        share = variance / self.max_shares  # each share's variance is at least this
        tau = 10 * (self.max_shares - 1) * math.exp(-(math.pi**2) * share)
        s2, s1, d = l2 / math.sqrt(variance), l1 / math.sqrt(variance), self.dim
        return min(
            alpha * s2**2 / 2 + tau * d,
            alpha * (s2**2 + 2 * s1 * tau + tau**2 * d) / 2,
            alpha * (s2 + tau * math.sqrt(d)) ** 2 / 2,
        )


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def poisson_amplified(alpha: int, rate: float, rdp: Callable[[int], float]) -> float:
    """Zhu and Wang 2019, Theorem 6: RDP at ``alpha`` of the mechanism ``rdp`` run on a Poisson
    sample of rate γ, under add-or-remove neighbours (never above the unsampled ``rdp(alpha)``)."""
    if rate >= 1:
        return rdp(alpha)
    g, a = rate, alpha
    terms = [(a - 1) * math.log1p(-g) + math.log(a * g - g + 1)]
    signs = [1.0]
    terms.append(math.log(a * (a - 1) / 2) + 2 * math.log(g) + (a - 2) * math.log1p(-g) + rdp(2))
    signs.append(1.0)
    if a >= 3:
        ls = np.arange(3, a + 1)
        eps = np.array([rdp(int(order)) for order in ls])
        logs = (ls - 1) * eps + _log_comb(a, ls) + (a - ls) * math.log1p(-g) + ls * math.log(g)
        terms.extend((logs + math.log(3)).tolist())
        signs.extend([1.0] * len(ls))
    return min(float(logsumexp(terms, b=signs)) / (a - 1), rdp(alpha))


def without_replacement_amplified(alpha: int, rate: float, rdp: Callable[[int], float]) -> float:
    """Wang, Balle and Kasiviswanathan 2019, Theorem 9 with ε(∞) = ∞: RDP at ``alpha`` of the
    mechanism ``rdp`` (replace-one) run on a fixed-size sample, without replacement, of a
    fraction γ of the population (never above the unsampled ``rdp(alpha)``)."""
    if rate >= 1:
        return rdp(alpha)
    g, a = rate, alpha
    e2 = rdp(2)
    second = min(math.log(4) + e2 + math.log(-math.expm1(-e2)), e2 + math.log(2))
    terms = [0.0, 2 * math.log(g) + math.log(a * (a - 1) / 2) + second]
    if a >= 3:
        js = np.arange(3, a + 1)
        eps = np.array([rdp(int(j)) for j in js])
        logs = js * math.log(g) + _log_comb(a, js) + (js - 1) * eps + math.log(2)
        terms.extend(logs.tolist())
    return min(float(logsumexp(terms)) / (a - 1), rdp(alpha))


@lru_cache(maxsize=32)
def curve(noise: IntegerNoise, schedule: Schedule) -> np.ndarray:
    """RDP of one aggregation at ``ORDERS``: ``noise`` on a sample drawn by ``schedule``."""
    replace_one = schedule.sampling == "without_replacement"
    amplify = without_replacement_amplified if replace_one else poisson_amplified

    def rdp(alpha: int) -> float:
        return noise.rdp(alpha, replace_one)

    out = np.array([amplify(int(a), schedule.rate, rdp) for a in ORDERS], dtype=np.float64)
    out.setflags(write=False)
    return out


def epsilon(noise: IntegerNoise, schedule: Schedule, steps: int, delta: float) -> float:
    """ε(δ) after ``steps`` aggregations (0 for none, inf without noise)."""
    if steps == 0:
        return 0.0
    if noise.noise_multiplier == 0:
        return math.inf
    rdp = steps * curve(noise, schedule)
    return float(rdp_privacy_accountant.compute_epsilon(ORDERS, rdp, delta)[0])


class DistributedAccountant:
    """``accounting.Accountant``'s interface for distributed noise: ε after k aggregations is a
    pure function of k (k times one aggregation's curve), so a resumed run reports the same."""

    method = "rdp"

    def __init__(self, noise: IntegerNoise, schedule: Schedule, delta: float) -> None:
        self.noise, self.schedule, self.delta = noise, schedule, delta
        self.steps = 0

    def step(self, count: int = 1) -> float:
        self.steps += int(count)
        return self.epsilon()

    def epsilon(self) -> float:
        return self.epsilon_after(self.steps)

    def epsilon_after(self, steps: int) -> float:
        return epsilon(self.noise, self.schedule, steps, self.delta)

    def state_dict(self) -> dict[str, Any]:
        return {**asdict(self.noise), "steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps = int(state["steps"])


def calibrate(
    target_epsilon: float,
    delta: float,
    steps: int,
    schedule: Schedule,
    noise: IntegerNoise,
    max_noise_multiplier: float,
) -> float:
    """The smallest z (to 1e-3 relative) whose ε after ``steps`` aggregations is within the
    target, by bisection (ε falls as z grows); ``TargetNotReachable`` where even
    ``max_noise_multiplier`` does not reach it."""

    def eps(z: float) -> float:
        return epsilon(replace(noise, noise_multiplier=z), schedule, steps, delta)

    if eps(max_noise_multiplier) > target_epsilon:
        raise TargetNotReachable(
            f"target ε={target_epsilon:g} at δ={delta:g} after {steps} aggregations needs a "
            f"noise multiplier above max_noise_multiplier={max_noise_multiplier:g}; use fewer "
            "rounds, a larger target or more clients"
        )
    lo, hi = 0.0, max_noise_multiplier
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        if eps(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi
