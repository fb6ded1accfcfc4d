"""FedOT-GDA with every client in lockstep in one process: the reference for the simulator.

With sync centring (FedOT spec §3.3) the simulator runs FedOT's clients as independent jobs: a
client cannot see the others' heads during its round. ``dual_centering: exact`` (the companion
code) needs them all at every ascent step: v_i = ṽ_i − mean_k ṽ_k inside one graph, i.e. each
ascent step moves v_i by η2·(g_i − mean_k g_k); the simulator then trains a round's clients
together on one worker (``FedOTClient.train_together``). ``Lockstep`` is the reference for both:
n copies of the resident model, full participation, ``FedOTClient.lockstep`` for the local
iterations (the very arithmetic of the simulator's clients) and the server rule written out
again (mean of the shared parts, trunk projection; with ``centring="sync"`` the heads are
re-centred at the sync, as the simulator's server mean v̄ does).

It is what the tests check invariants 6, 7 and 11 against, and the plain single-process loop of
``benchmarks/fedot_speed.py``. It runs on the server's side of nothing: there is no
coordinator, no worker and no personal-state store here; the caller gives every client's data and
batch indices.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from .client import FedOTClient, LocalRound
from .families import cap_spectral
from .model import TRUNK_PREFIX, FedOTModel
from .params import FedOTParams


class Lockstep:
    """n clients of FedOT-GDA advanced together; ``round`` = τ local iterations + sync."""

    def __init__(
        self,
        template: FedOTModel,
        n: int,
        params: FedOTParams,
        task,
        lr: float,
        centring: Literal["exact", "sync"] = "exact",
    ) -> None:
        self.models = [copy.deepcopy(template) for _ in range(n)]
        self.client = FedOTClient(params)
        self.params = params
        self.task = task
        self.lr = lr
        self.lr_map = lr if params.lr_map is None else params.lr_map
        self.lr_up = lr if params.lr_ascent is None else params.lr_ascent
        self.centring = centring

    # ------------------------------------------------------------------ parts
    def shared(self, m: FedOTModel) -> list[torch.nn.Parameter]:
        """Predictor then trunk: what the server averages."""
        trunk = [q for n, q in m.named_parameters() if n.startswith(TRUNK_PREFIX)]
        return [q for q in m.predictor.parameters() if q.requires_grad] + trunk

    def heads(self, m: FedOTModel) -> list[torch.nn.Parameter]:
        return list(m.potential.head.parameters())

    def trunk(self, m: FedOTModel) -> list[torch.nn.Parameter]:
        return [q for n, q in m.named_parameters() if n.startswith(TRUNK_PREFIX)]

    def effective_heads(self) -> np.ndarray:
        """(n, head size) float64: the heads every client trains with."""
        return np.stack(
            [
                torch.cat([h.detach().reshape(-1) for h in self.heads(m)]).numpy()
                for m in self.models
            ]
        )

    def round(self, data: Sequence[tuple], batches: Sequence[Sequence[torch.Tensor]]) -> float:
        """τ local iterations of every client (``batches[i][t]``: client i's indices at
        iteration t into ``data[i]``), then the sync; returns the mean task loss."""
        runs = []
        for m, d, b in zip(self.models, data, batches, strict=True):
            m.train()
            w, theta, heads, trunk = self.client.parts(m)
            runs.append(
                LocalRound(
                    m,
                    w,
                    theta,
                    heads,
                    trunk,
                    self.lr,
                    self.lr_map,
                    self.lr_up,
                    self.task,
                    d,
                    list(b),
                )
            )
        self.client.lockstep(runs, exact=self.centring == "exact")
        self.sync()
        return float(np.mean([loss for r in runs for loss in r.losses]))

    def sync(self) -> None:
        """Shared parts ← their mean (trunk projected); sync centring re-centres the heads."""
        with torch.no_grad():
            for tensors in zip(*(self.shared(m) for m in self.models), strict=True):
                mean = torch.stack([t.detach() for t in tensors]).mean(dim=0)
                for t in tensors:
                    t.copy_(mean)
            if self.params.trunk_cap:
                for m in self.models:
                    if self.trunk(m):
                        cap_spectral(m.potential.trunk.weight)
            if self.centring == "sync":
                for tensors in zip(*(self.heads(m) for m in self.models), strict=True):
                    mean = torch.stack([t.detach() for t in tensors]).mean(dim=0)
                    for t in tensors:
                        t.sub_(mean)
