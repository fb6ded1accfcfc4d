"""FedAsync (Xie et al. 2019), as Feddle spec §4.3: per-arrival mixing with a staleness function.

``α_t = α · s(τ)`` with τ = ``tau_versions`` (or, ``staleness_unit: rounds``, the rounds since
the download: one version per arrival makes τ about S a round) and s one of (Xie et al. §5.2):
constant ``1``; polynomial ``(τ+1)^(−a)``; hinge ``1`` if τ ≤ b else ``1/(a(τ−b)+1)``.
Model-mixing form (default, the original): ``ω ← (1−α_t) ω + α_t (ω^{k_j} + Δ_j)``;
delta form (switch ``form: delta``, Feddle spec A16): ``ω ← ω + α_t Δ_j``.
"""

from __future__ import annotations

import numpy as np

from ..base import Method, Strategy, Update
from ..registry import register
from .params import METHODS, FedAsyncParams


def staleness_weight(tau: int, p: FedAsyncParams) -> float:
    """s(τ) for the configured staleness function."""
    if p.staleness == "constant":
        return 1.0
    if p.staleness == "polynomial":
        return float((tau + 1) ** (-p.a))
    return 1.0 if tau <= p.b else 1.0 / (p.a * (tau - p.b) + 1.0)


class FedAsync(Strategy):
    """Every arrival changes the global model (one version per arrival)."""

    params: FedAsyncParams

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.last_alpha = float("nan")

    def on_arrival(self, update: Update) -> bool:
        p = self.params
        tau = update.tau_versions if p.staleness_unit == "versions" else update.tau_rounds
        alpha = np.float32(p.mixing * staleness_weight(tau, p))
        if self.params.form == "delta":
            self.weights = self.weights + alpha * update.delta
        else:
            self.weights = (np.float32(1) - alpha) * self.weights + alpha * update.local_weights
        self.last_alpha = float(alpha)
        return True

    def metrics(self) -> dict[str, float]:
        return {"fedasync_alpha": self.last_alpha}


METHOD = register(Method.of(METHODS["fedasync"], strategy=FedAsync))
