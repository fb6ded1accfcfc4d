"""A one-run privacy audit of a raysim run with canary clients.

The statistics are those of Steinke, Nasr and Jagielski 2023, "Privacy Auditing with One (1)
Training Run" (NeurIPS 2023, arXiv:2305.08846): ``m`` canaries, each included independently with
probability 1/2; after the one run the auditor scores every canary, guesses "in" on the ``k+``
highest scores and "out" on the ``k-`` lowest, abstains on the rest, and counts its ``w`` correct
guesses out of ``r = k+ + k-``. Their main theorem bounds how likely ``w`` correct guesses are
under (ε, δ)-DP (for δ = 0: W is stochastically dominated by Binomial(r, e^ε / (1 + e^ε)));
:func:`p_value` is that bound and :func:`epsilon_lower_bound` inverts it into an empirical lower
bound on ε, as the Python of their Appendix D (``p_value_DP_audit``, ``get_eps_audit``) does.

The canaries here are clients (user-level DP, in the spirit of Andrew et al. 2024, "One-shot
Empirical Privacy Estimation for Federated Learning", arXiv:2302.03098): canary ``i``'s update is
the fixed random unit vector :meth:`CanaryPlan.direction` (scaled by whoever runs the client, e.g.
to the clip norm), it takes part only when :meth:`CanaryPlan.included` says so, and its score is
the cosine of that direction with the run's total model change (final minus initial global
weights). Andrew et al. turn the cosines into an ε *estimate* by fitting Gaussians; this module
instead uses Steinke et al.'s test, which gives a lower bound that holds with the stated confidence
for any mechanism that really is (ε, δ)-DP with respect to one canary client.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special

#: rng = default_rng([seed, CANARY_INCLUSION_TAG]) draws which canaries take part.
CANARY_INCLUSION_TAG = 0xCA41
#: rng = default_rng([seed, CANARY_DIRECTION_TAG, i]) draws canary ``i``'s direction.
CANARY_DIRECTION_TAG = 0xCA4D
#: The default ceiling on :meth:`CanaryPlan.directions`' matrix (2 GiB).
DIRECTIONS_MAX_BYTES = 2 * 1024**3
#: Values per block when canary scores are computed in float64 (bounds the temporary copy).
_SCORE_BLOCK_ELEMENTS = 1 << 23
#: The bracket of the ε search never needs to pass this (the p-value is 1 once expit(ε) == 1).
_EPSILON_SEARCH_LIMIT = 1024.0


@dataclass(frozen=True)
class CanaryPlan:
    """Which of ``canaries`` canary clients take part, and the update direction of each."""

    canaries: int
    seed: int

    def __post_init__(self) -> None:
        if int(self.canaries) != self.canaries or self.canaries < 1:
            raise ValueError(f"canaries must be a positive integer, got {self.canaries!r}")
        if int(self.seed) != self.seed or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    def included(self) -> np.ndarray:
        """bool[m]: canary ``i`` takes part in the run; each True with probability 1/2,
        independently (the randomisation Steinke et al.'s theorem needs)."""
        rng = np.random.default_rng([self.seed, CANARY_INCLUSION_TAG])
        return rng.random(self.canaries) < 0.5

    def direction(self, index: int, dim: int) -> np.ndarray:
        """float32[dim]: canary ``index``'s unit vector (a normalised standard Gaussian), drawn
        from its own stream so that it needs none of the others."""
        if not 0 <= index < self.canaries:
            raise IndexError(f"canary index {index} outside 0..{self.canaries - 1}")
        if dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        rng = np.random.default_rng([self.seed, CANARY_DIRECTION_TAG, int(index)])
        z = rng.standard_normal(int(dim))
        return (z / np.linalg.norm(z)).astype(np.float32)

    def directions(self, dim: int, max_bytes: int = DIRECTIONS_MAX_BYTES) -> np.ndarray:
        """float32[m, dim]: every canary's :meth:`direction`; refuses (ValueError) when the
        matrix would take more than ``max_bytes`` before allocating it."""
        need = self.canaries * int(dim) * 4
        if need > max_bytes:
            raise ValueError(
                f"{self.canaries} canary directions of dim {dim} need {need} bytes, over "
                f"max_bytes={max_bytes}; use CanaryPlan.direction(i, dim) one at a time"
            )
        out = np.empty((self.canaries, int(dim)), dtype=np.float32)
        for i in range(self.canaries):
            out[i] = self.direction(i, dim)
        return out


def canary_scores(model_delta: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """float64[m]: cosine of the run's total model change with each canary direction.

    Cosine, as Andrew et al. use: it is scale-free (comparable across runs, learning rates and
    clip norms) and, for unit-norm directions, a positive common multiple of the inner product,
    so the ranking, the guesses and the bound are the same as with inner products. A zero model
    change (or a zero direction) scores 0. ``model_delta`` may have any shape; it is flattened.
    """
    delta = np.asarray(model_delta, dtype=np.float64).ravel()
    rows = np.asarray(directions)
    if rows.ndim != 2 or rows.shape[1] != delta.size:
        raise ValueError(
            f"directions must be [m, {delta.size}] for a model change of {delta.size} values, "
            f"got shape {rows.shape}"
        )
    if not np.isfinite(delta).all():
        raise ValueError("model_delta has non-finite values")
    delta_norm = float(np.linalg.norm(delta))
    scores = np.zeros(rows.shape[0], dtype=np.float64)
    if delta_norm == 0.0:
        return scores
    block = max(1, _SCORE_BLOCK_ELEMENTS // max(1, delta.size))
    for start in range(0, rows.shape[0], block):
        part = rows[start : start + block].astype(np.float64)
        norms = np.linalg.norm(part, axis=1)
        dots = part @ delta
        safe = norms > 0
        scores[start : start + block][safe] = dots[safe] / (norms[safe] * delta_norm)
    return scores


def guesses(scores: np.ndarray, k_plus: int, k_minus: int) -> np.ndarray:
    """int8[m]: +1 ("in") on the ``k_plus`` highest scores, -1 ("out") on the ``k_minus`` lowest,
    0 (abstain) elsewhere. Ties are broken by index: canaries are ordered by (score, index), so
    among equal scores the lower index counts as the lower score."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    m = s.size
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError(f"need k_plus, k_minus >= 0 and k_plus + k_minus <= {m}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    order = np.lexsort((np.arange(m), s))  # ascending by score, then by index
    out = np.zeros(m, dtype=np.int8)
    out[order[:k_minus]] = -1
    if k_plus:
        out[order[m - k_plus :]] = 1
    return out


def correct(guesses: np.ndarray, included: np.ndarray) -> tuple[int, int]:
    """(correct guesses, guesses made): a +1 is correct on an included canary, a -1 on an
    excluded one; abstentions count for neither."""
    g = np.asarray(guesses).ravel()
    inc = np.asarray(included, dtype=bool).ravel()
    if g.shape != inc.shape:
        raise ValueError(f"guesses {g.shape} and included {inc.shape} differ in length")
    right = int(np.count_nonzero((g == 1) & inc) + np.count_nonzero((g == -1) & ~inc))
    return right, int(np.count_nonzero(g))


def p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Bound on P[W >= correct] for an (ε, δ)-DP run, Steinke et al.'s main theorem.

    With f(v) = P[Binomial(r, e^ε / (1 + e^ε)) >= v] it is
    ``f(v) + 2·m·δ·max_{i=1..v} (f(v-i) - f(v)) / i``, capped at 1 (Appendix D's
    ``p_value_DP_audit``); δ = 0 leaves the binomial tail alone (pure ε-DP: W is stochastically
    dominated by that binomial). i beyond v cannot give the maximum (f(v-i) is already 1), so
    only i = 1..v is evaluated, as in Appendix D; the tails are ``scipy.special.bdtrc``.
    """
    m, r, v = int(canaries), int(guesses), int(correct)
    _check_counts(m, r, v)
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    if epsilon < 0 or np.isnan(epsilon):
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    q = float(special.expit(epsilon))  # accuracy of ε-DP randomised response
    tail = float(special.bdtrc(v - 1, r, q))  # f(v) = P[B >= v] = P[B > v - 1]; 1 when v = 0
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    alpha = float(np.max((special.bdtrc(v - 1 - i, r, q) - tail) / i))  # (f(v-i) - f(v)) / i
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def epsilon_lower_bound(
    canaries: int, guesses: int, correct: int, delta: float = 0.0, confidence: float = 0.95
) -> float:
    """The largest ε that the audit rejects at this confidence: every (ε', δ)-DP claim with
    ε' below it is rejected (its :func:`p_value` is under 1 - confidence); 0.0 when even ε = 0
    is not rejected. Monotone: more correct guesses give a larger bound.

    This is Steinke et al.'s Appendix D search (``get_eps_audit``) carried to convergence: their
    code brackets in steps of 1 and stops after 30 halvings; here the bracket doubles and the
    bisection runs until the interval is below 1e-10 (relative above 1), returning the rejected
    end, so the value is conservative by at most that tolerance. δ enters only through
    :func:`p_value`'s ``2·m·δ`` term. The p-value is non-decreasing in ε and non-increasing in
    the correct count (checked numerically over grids of m, r, δ, not proven here), so the
    rejected ε form an interval [0, bound) and bisection finds its end.
    """
    m, r, v = int(canaries), int(guesses), int(correct)
    _check_counts(m, r, v)
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    beta = 1.0 - confidence

    def rejected(eps: float) -> bool:
        return p_value(m, r, v, eps, delta) < beta

    if not rejected(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while rejected(hi):  # ends: expit(ε) rounds to 1 by ε = 64, where the p-value is 1
        if hi > _EPSILON_SEARCH_LIMIT:
            raise RuntimeError(f"p-value still below {beta} at ε = {hi}: not a valid bound")
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if rejected(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _check_counts(m: int, r: int, v: int) -> None:
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got {v}, {r}, {m}")


@dataclass(frozen=True)
class AuditResult:
    """One audit: the counts, the (δ, confidence) it was run at, and the bound on ε."""

    canaries: int
    guesses: int
    correct: int
    delta: float
    confidence: float
    epsilon_lower_bound: float

    def as_metrics(self) -> dict[str, float]:
        """The result as run metrics, each key prefixed ``dp_audit_``."""
        return {
            "dp_audit_canaries": float(self.canaries),
            "dp_audit_guesses": float(self.guesses),
            "dp_audit_correct": float(self.correct),
            "dp_audit_delta": float(self.delta),
            "dp_audit_confidence": float(self.confidence),
            "dp_audit_epsilon_lower_bound": float(self.epsilon_lower_bound),
        }


def audit(
    model_delta: np.ndarray,
    plan: CanaryPlan,
    k_plus: int,
    k_minus: int,
    delta: float,
    confidence: float = 0.95,
) -> AuditResult:
    """Audit one run from its total model change (final minus initial global weights).

    Scores are :func:`canary_scores` on blocks of regenerated canary directions (memory: one
    block of at most ~8M values, never the whole ``m·dim`` matrix), so they equal
    ``canary_scores(model_delta, plan.directions(dim))``.
    ``k_plus`` and ``k_minus`` must be fixed before looking at the scores; choosing them after
    (e.g. the best of several) would need a correction this function does not make.
    """
    flat = np.asarray(model_delta, dtype=np.float64).ravel()
    dim = flat.size
    block = max(1, _SCORE_BLOCK_ELEMENTS // max(1, dim))
    parts = []
    for start in range(0, plan.canaries, block):
        stop = min(start + block, plan.canaries)
        rows = np.stack([plan.direction(i, dim) for i in range(start, stop)])
        parts.append(canary_scores(flat, rows))
    scores = np.concatenate(parts)
    g = guesses(scores, k_plus, k_minus)
    w, r = correct(g, plan.included())
    bound = epsilon_lower_bound(plan.canaries, r, w, delta=delta, confidence=confidence)
    return AuditResult(plan.canaries, r, w, float(delta), float(confidence), bound)
