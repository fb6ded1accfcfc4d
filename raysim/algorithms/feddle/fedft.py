"""Fed+FT (Feddle spec §4.6 [P + I]): aggregate, then fine-tune on the in-distribution server set.

At every round end: the base aggregation (``base_aggregator``: ``fedavg``, §4.2, the default
[I, A15]; or ``fedbuff_per_round`` with η = 1, §4.4), then ``server_epochs`` epochs of Adam
(``server_lr``) on the ``data.server.id_size`` in-distribution samples. The fine-tuned model is the
new global model. Runs every round, also when no update arrived.
"""

from __future__ import annotations

import numpy as np

from ..base import Method, WeightedMean
from ..general.fedavg import RoundBuffer
from ..registry import register
from .params import METHODS, FedFTParams
from .server_training import id_pool, train_on_server


def base_delta(strategy: RoundBuffer, rule: str) -> np.ndarray | None:
    """The round's aggregate delta: FedAvg's (§4.2) or FedBuff's per-round flush with η = 1
    (uniform weights, §4.4); None when nothing arrived."""
    pending = strategy.pending
    if rule == "fedavg" or not pending:
        return strategy.round_delta()
    return WeightedMean.combine([u.delta for u in pending], [1.0 / len(pending)] * len(pending))


class FedFT(RoundBuffer):
    params: FedFTParams

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.server_loss = float("nan")

    def on_round_end(self, round_index: int) -> bool:
        delta = base_delta(self, self.params.base_aggregator)
        self.pending = []
        w = self.weights if delta is None else self.weights + delta
        pool = id_pool(self.ctx, "fedft")
        self.weights, m = train_on_server(
            self.ctx, w, pool.data, self.params.recipe(), f"fedft/{round_index}"
        )
        self.server_loss = m["train_loss"]
        return True

    def metrics(self) -> dict[str, float]:
        return {"server_train_loss": self.server_loss}


METHOD = register(Method.of(METHODS["fedft"], strategy=FedFT))
