"""A user's method module, as the plugin tests load it (``algorithm.module``).

``echo`` uses the side channels both ways and keeps server-private state: every round it sends a
``probe`` tensor to all dispatched clients and an ``own`` tensor to each one; a client sends back
``probe * scale + client_id`` and its ``own`` tensor; the server counts mismatches. After each
FedAvg step it adds ``0.01 * secret`` to the model, ``secret`` being a ``PrivateTensors`` drawn in
``setup`` from a named server stream (rebuilt on resume; or, with ``persist``, checkpointed
through ``private_state``).
"""

from __future__ import annotations

import numpy as np

from raysim.algorithms import ClientAlgorithm, Method, MethodParams, register
from raysim.algorithms.base import Downlink
from raysim.algorithms.general.fedavg import FedAvg
from raysim.algorithms.private import PrivateTensors


class EchoParams(MethodParams):
    scale: float = 2.0
    persist: bool = False


class EchoClient(ClientAlgorithm):
    params: EchoParams

    def train(self, ctx):
        metrics = super().train(ctx)
        ctx.upload("echo", ctx.downlink["probe"] * np.float32(self.params.scale) + ctx.client_id)
        ctx.upload("own_echo", ctx.downlink["own"])
        return metrics


class Echo(FedAvg):
    params: EchoParams
    transient = ("secret",)

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.received = 0
        self.mismatches = 0

    def setup(self, ctx) -> None:
        super().setup(ctx)
        draw = ctx.rng("echo/secret").normal(size=ctx.layout.size).astype(np.float32)
        self.secret = PrivateTensors({"w": draw})

    def private_state(self):
        return {"secret": np.array(self.secret["w"])} if self.params.persist else {}

    def load_private_state(self, arrays) -> None:
        if self.params.persist:
            self.secret = PrivateTensors({"w": arrays["secret"]})

    def configure(self, round_index, clients):
        probe = np.full(4, round_index, dtype=np.float32)
        own = {c: {"own": np.array([c, round_index], dtype=np.float32)} for c in clients}
        return Downlink({"probe": probe}, own)

    def on_arrival(self, update):
        k, c = update.dispatch_round, update.client_id
        want = np.full(4, k, dtype=np.float32) * np.float32(self.params.scale) + c
        ok = np.array_equal(update.extras["echo"], want) and np.array_equal(
            update.extras["own_echo"], np.array([c, k], dtype=np.float32)
        )
        self.received += 1
        self.mismatches += 0 if ok else 1
        return super().on_arrival(update)

    def on_round_end(self, round_index):
        changed = super().on_round_end(round_index)
        self.weights = self.weights + np.float32(0.01) * self.secret["w"]
        return changed

    def metrics(self):
        return {"echo_received": float(self.received), "echo_mismatches": float(self.mismatches)}


METHOD = register(
    Method(name="echo", strategy=Echo, params=EchoParams, client=EchoClient, reference="tests")
)
