"""FedBuff (Nguyen et al. 2022), as Feddle spec §4.4: a count-triggered buffer across rounds.

On each arrival the update joins the buffer; when it holds ``buffer_size`` (K) updates the server
applies ``ω ← ω + η (1/K) Σ w(τ) Δ`` and empties it (one version per flush). ``w ≡ 1`` by default;
``staleness_weight: inv_sqrt`` gives ``1/√(1+τ_versions)`` (Feddle spec A9). ``per_round: true`` is
``fedbuff_per_round`` (flush at every round end with K := |R_k|), the rule Feddle's fallback uses.
A partial buffer left when the run ends is dropped (Feddle spec §2.2).
"""

from __future__ import annotations

import math

from ..base import Method, Strategy, Update, WeightedMean
from ..registry import register
from .params import METHODS, FedBuffParams, StalenessWeight


def staleness_weight(rule: StalenessWeight, update: Update) -> float:
    """FedBuff's ``w(τ)``: 1, or ``1/√(1+τ_versions)`` (Feddle spec A9)."""
    return 1.0 / math.sqrt(1.0 + update.tau_versions) if rule == "inv_sqrt" else 1.0


class FedBuff(Strategy):
    params: FedBuffParams
    sums_updates = True  # a buffer's step is one weighted sum; w(τ) reads the staleness only

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.buffer: list[Update] = []
        self.flushes = 0

    def _flush(self) -> None:
        k, eta = len(self.buffer), self.params.server_lr
        rule = self.params.staleness_weight
        weights = [eta * staleness_weight(rule, u) / k for u in self.buffer]
        self.weights = self.weights + WeightedMean.combine([u.delta for u in self.buffer], weights)
        self.buffer = []
        self.flushes += 1

    def on_arrival(self, update: Update) -> bool:
        self.buffer.append(update)
        if not self.params.per_round and len(self.buffer) >= self.params.buffer_size:
            self._flush()
            return True
        return False

    def on_round_end(self, round_index: int) -> bool:
        if self.params.per_round:
            if self.buffer:
                self._flush()
            return True
        return False

    @property
    def sums_each_round(self) -> bool:
        """Only where it flushes every round (``per_round``)."""
        return bool(self.params.per_round)

    def updates_per_aggregation(self, clients_per_round: int) -> int:
        """K, or the round's clients where it flushes every round."""
        return clients_per_round if self.params.per_round else self.params.buffer_size

    def metrics(self) -> dict[str, float]:
        return {"fedbuff_flushes": float(self.flushes), "fedbuff_buffered": float(len(self.buffer))}


METHOD = register(Method.of(METHODS["fedbuff"], strategy=FedBuff))


METHOD_PER_ROUND = register(Method.of(METHODS["fedbuff_per_round"], strategy=FedBuff))
