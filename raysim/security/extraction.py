"""Extraction of FedBaF's foundation weights by clients (FedBaF spec §6.2), and how close it gets.

Line 11 of Alg. 1 puts ``w_pre`` on a known line each round: ``w_pre = w_{t+1} + u_t / c_t`` with
``u_t = w_{t+1} − w'_{t+1}``. Colluders who know the broadcasts and the aggregates solve for it:

- ``e0_static_alpha``: α fixed (``alpha_random: false``), so ``c_t = α·τ_t`` with τ_t computable
  from public vectors; two rounds give 1/α by least squares (the paper's own example);
- ``e2_two_rounds``: α random; two rounds' lines meet at ``w_pre``: solve
  ``a·u_t − b·u_{t+1} = w_{t+2} − w_{t+1}`` for (a, b), then ``ŵ = w_{t+1} + a·u_t``;
- ``e1_one_round``: one curious client guesses the aggregate and c (``ŵ = w_1 + (w_1 − ŵ'_1)/ĉ``).

All on the matched coordinates, in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _f64(*xs: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) for x in xs]


def tau(previous: np.ndarray, aggregated: np.ndarray, t: int) -> float:
    """τ_t of Alg. 1 line 9 from public vectors (w_t and the rebuilt w'_{t+1})."""
    a, b = _f64(aggregated, previous)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    ua = a / na if na else a
    ub = b / nb if nb else b
    return float(np.linalg.norm(ua - ub)) / math.sqrt(t + 1)


def e2_two_rounds(w1: np.ndarray, agg1: np.ndarray, w2: np.ndarray, agg2: np.ndarray) -> np.ndarray:
    """ŵ_pre from two rounds: broadcasts w_{t+1}, w_{t+2}, aggregates w'_{t+1}, w'_{t+2}."""
    w1, agg1, w2, agg2 = _f64(w1, agg1, w2, agg2)
    u1, u2 = w1 - agg1, w2 - agg2
    (a, _b), *_ = np.linalg.lstsq(np.stack([u1, -u2], axis=1), w2 - w1, rcond=None)
    return w1 + a * u1


def e0_static_alpha(
    w0: np.ndarray,
    agg1: np.ndarray,
    w1: np.ndarray,
    agg2: np.ndarray,
    w2: np.ndarray,
    t: int = 0,
) -> np.ndarray:
    """ŵ_pre when α is one constant: c = α·τ with τ public, so 1/α comes from two rounds."""
    w0, agg1, w1, agg2, w2 = _f64(w0, agg1, w1, agg2, w2)
    g1 = (w1 - agg1) / tau(w0, agg1, t)
    g2 = (w2 - agg2) / tau(w1, agg2, t + 1)
    inv_alpha = float(np.dot(g1 - g2, w2 - w1) / np.dot(g1 - g2, g1 - g2))
    return w1 + inv_alpha * g1


def e1_one_round(w1: np.ndarray, agg1_guess: np.ndarray, c_guess: float) -> np.ndarray:
    """One curious client: its guess of the aggregate and of c (e.g. 1.5ψ)."""
    w1, g = _f64(w1, agg1_guess)
    return w1 + (w1 - g) / c_guess


@dataclass(frozen=True)
class Closeness:
    """How close an estimate is to the foundation: relative L2 error, cosine, the paper's Dist."""

    relative_error: float
    cosine: float
    dist: float

    @classmethod
    def of(cls, estimate: np.ndarray, w_pre: np.ndarray) -> Closeness:
        e, p = _f64(estimate, w_pre)
        rel = float(np.linalg.norm(e - p) / np.linalg.norm(p))
        cos = float(np.dot(e, p) / (np.linalg.norm(e) * np.linalg.norm(p)))
        nz = e != 0
        dist = float(np.mean(np.abs(e[nz] - p[nz]) / np.abs(e[nz])))  # App. G.1's Dist
        return cls(rel, cos, dist)
