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

from .base import Method, MethodParams, Strategy, Update, WeightedMean
from .registry import register


class FedBuffParams(MethodParams):
    buffer_size: int = Field(10, ge=1, description="K, updates per flush")
    server_lr: float = Field(1.0, gt=0, description="η")
    staleness_weight: Literal["none", "inv_sqrt"] = "none"
    per_round: bool = False


class FedBuff(Strategy):
    params: FedBuffParams

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.buffer: list[Update] = []
        self.flushes = 0

    def _weight(self, u: Update) -> float:
        if self.params.staleness_weight == "inv_sqrt":
            return 1.0 / math.sqrt(1.0 + u.tau_versions)
        return 1.0

    def _flush(self) -> None:
        k, eta = len(self.buffer), self.params.server_lr
        weights = [eta * self._weight(u) / k for u in self.buffer]
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
