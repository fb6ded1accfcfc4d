"""Center (Feddle spec §4.1 [P + I]): train the initial model on the in-distribution server set
only.

No client is ever dispatched (invariant I-13: the Center run touches no clients). The whole
training (``server_epochs`` epochs of Adam on ``data.server.id_size`` samples) happens at the end
of round 0; later rounds leave the model unchanged. One number per (dataset, model).
"""

from __future__ import annotations

from ..base import Method, Strategy
from ..registry import register
from .params import METHODS, CenterParams
from .server_training import id_pool, train_on_server


class Center(Strategy):
    params: CenterParams
    uses_clients = False

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.server_loss = float("nan")

    def on_round_end(self, round_index: int) -> bool:
        if round_index == 0:
            pool = id_pool(self.ctx, "center")
            self.weights, m = train_on_server(
                self.ctx, self.weights, pool.data, self.params.recipe(), "center"
            )
            self.server_loss = m["train_loss"]
        return True

    def metrics(self) -> dict[str, float]:
        return {"server_train_loss": self.server_loss}


METHOD = register(Method.of(METHODS["center"], strategy=Center))
