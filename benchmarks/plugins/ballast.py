"""``ballast``: FedAvg whose clients each keep ``mib`` MiB of ``ClientContext.state`` and check,
on every visit, that what came back is what they left (``benchmarks/state_beyond_ram.py``).

The array of client c after v visits is ``(arange(n) * (c + 1) + v) % 65521`` in float32 (whole
numbers, exact): a visit compares it with what the last one left, counts a mismatch in the
uplink, and leaves the next. The server reports ``ballast_visits`` and ``ballast_broken``.
"""

from __future__ import annotations

import numpy as np

from raysim.algorithms import ClientAlgorithm, Method, MethodParams, register
from raysim.algorithms.general.fedavg import FedAvg


class BallastParams(MethodParams):
    mib: float = 8.0


def pattern(client: int, visits: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * (client + 1) + visits) % 65521).astype(np.float32)


class BallastClient(ClientAlgorithm):
    params: BallastParams

    @classmethod
    def state_nbytes(cls, params: BallastParams) -> int:
        return int(params.mib * 2**20) + 8  # the pattern and the visit count

    def train(self, ctx):
        metrics = super().train(ctx)
        n = int(self.params.mib * 2**20 // 4)
        visits = int(np.asarray(ctx.state.get("visits", 0)))
        broken = 0.0
        if visits:
            broken = float(
                not np.array_equal(ctx.state["ballast"], pattern(ctx.client_id, visits, n))
            )
        ctx.state["visits"] = np.array(visits + 1)
        ctx.state["ballast"] = pattern(ctx.client_id, visits + 1, n)
        ctx.upload("ballast_broken", np.array([broken], dtype=np.float32))
        return metrics


class Ballast(FedAvg):
    params: BallastParams

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.visits = 0
        self.broken = 0

    def on_arrival(self, update):
        self.visits += 1
        self.broken += int(update.extras["ballast_broken"][0])
        return super().on_arrival(update)

    def metrics(self):
        return {"ballast_visits": float(self.visits), "ballast_broken": float(self.broken)}


METHOD = register(
    Method(
        name="ballast",
        strategy=Ballast,
        params=BallastParams,
        client=BallastClient,
        reference="benchmarks",
    )
)
