"""FedBuff (Nguyen et al. 2022), as feddle.md §4.4: a count-triggered buffer across rounds.

On each arrival the update joins the buffer; when it holds ``buffer_size`` (K) updates the server
applies ``ω ← ω + η (1/K) Σ w(τ) Δ`` and empties it (one version per flush). ``w ≡ 1`` by default;
``staleness_weight: inv_sqrt`` gives ``1/√(1+τ_versions)`` (feddle.md A9). ``per_round: true`` is
``fedbuff_per_round`` (flush at every round end with K := |R_k|), the rule Feddle's fallback uses.
A partial buffer left when the run ends is dropped (feddle.md §2.2).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from ..base import Method, MethodParams, Strategy, Update, WeightedMean
from ..registry import register

StalenessWeight = Literal["none", "inv_sqrt"]


def staleness_weight(rule: StalenessWeight, update: Update) -> float:
    """FedBuff's ``w(τ)``: 1, or ``1/√(1+τ_versions)`` (feddle.md A9)."""
    return 1.0 / math.sqrt(1.0 + update.tau_versions) if rule == "inv_sqrt" else 1.0


class FedBuffParams(MethodParams):
    buffer_size: int = Field(10, ge=1, description="K, updates per flush")
    server_lr: float = Field(1.0, gt=0, description="η")
    staleness_weight: StalenessWeight = "none"
    per_round: bool = False


class FedBuff(Strategy):
    params: FedBuffParams

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

    def metrics(self) -> dict[str, float]:
        return {"fedbuff_flushes": float(self.flushes), "fedbuff_buffered": float(len(self.buffer))}


METHOD = register(
    Method(
        name="fedbuff",
        strategy=FedBuff,
        params=FedBuffParams,
        reference="Nguyen et al. 2022; feddle.md §4.4",
    )
)


class FedBuffPerRoundParams(FedBuffParams):
    per_round: bool = True


METHOD_PER_ROUND = register(
    Method(
        name="fedbuff_per_round",
        strategy=FedBuff,
        params=FedBuffPerRoundParams,
        reference="FedBuff flushed at every round end (K := |R_k|); feddle.md §4.4, I-4, I-6",
    )
)
