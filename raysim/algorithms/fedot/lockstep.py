"""FedOT-GDA with every client in lockstep in one process: the reference for the simulator.

The simulator runs FedOT's clients as independent jobs with sync centring (fedot.md §3.3): a
client cannot see the others' heads during its round. ``dual_centering: exact`` (the companion
code) needs them all at every ascent step: v_i = ṽ_i − mean_k ṽ_k inside one graph, i.e. each
ascent step moves v_i by η2·(g_i − mean_k g_k). ``Lockstep`` runs that: n copies of the resident
model, full participation, the same client arithmetic (``FedOTClient``'s ascent gradient,
descent step, caps) and the same server rule (mean of the shared parts, trunk projection). With
``centring="sync"`` it re-centres only at sync instead, which is what the simulator does.

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

from .client import FedOTClient, mapped_features, sgd
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

    # ------------------------------------------------------------------ steps
    def _centre(self, grads: list[list[torch.Tensor]], k: int) -> None:
        """Exact centring: subtract the clients' mean from the first ``k`` (head) gradients."""
        for j in range(k):
            mean = torch.stack([g[j] for g in grads]).mean(dim=0)
            for g in grads:
                g[j] = g[j] - mean

    def _project(self) -> None:
        """The caps after an ascent step; under exact centring, caps that would break Σ v_i = 0
        (γ and W1) scale every client's head by one common factor instead."""
        p = self.params
        if self.centring == "sync":
            for m in self.models:
                self.client.project(m, self.heads(m), self.trunk(m))
            return
        if p.trunk_cap:
            for m in self.models:
                if self.trunk(m):
                    cap_spectral(m.potential.trunk.weight)
        limits = []
        if p.gamma_cap != "none":
            peak = max(
                (float(t.abs().max()) for m in self.models for t in m.potential.curvature()),
                default=0.0,
            )
            limits.append(p.gamma / peak if peak > p.gamma else 1.0)
        if p.cost == "w1_lip":
            peak = max(float(np.linalg.norm(v)) for v in self.effective_heads())
            limits.append(1.0 / peak if peak > 1.0 else 1.0)
        factor = min(limits, default=1.0)
        if factor < 1.0:
            with torch.no_grad():
                for m in self.models:
                    for h in self.heads(m):
                        h.mul_(factor)

    def _ascent(self, xs: Sequence[torch.Tensor]) -> None:
        mapped = [mapped_features(m, x) for m, x in zip(self.models, xs, strict=True)]
        for _ in range(self.params.ascent_steps):
            grads = []
            for m, (y, mask, feats) in zip(self.models, mapped, strict=True):
                g = self.client.ascent_gradient(m, y, mask, feats, self.heads(m), self.trunk(m))
                if g is None:
                    return
                grads.append(g)
            if self.centring == "exact":
                self._centre(grads, len(self.heads(self.models[0])))
            for m, g in zip(self.models, grads, strict=True):
                sgd(self.heads(m) + self.trunk(m), g, -self.lr_up)
            self._project()

    def _simultaneous(self, batches) -> list[float]:
        losses, grads, descents = [], [], []
        for m, batch in zip(self.models, batches, strict=True):
            k = len(self.shared_descent(m))
            params = self.shared_descent(m) + self.heads(m) + self.trunk(m)
            g, loss, _ = self.client.joint_gradient(m, self.task, batch, params)
            grads.append(g[k:])
            descents.append(g[:k])
            losses.append(loss)
        if self.centring == "exact":
            self._centre(grads, len(self.heads(self.models[0])))
        for m, gd, ga in zip(self.models, descents, grads, strict=True):
            w = [q for q in m.predictor.parameters() if q.requires_grad]
            sgd(w, gd[: len(w)], self.lr)
            sgd(list(m.psi.parameters()), gd[len(w) :], self.lr_map)
            sgd(self.heads(m) + self.trunk(m), ga, -self.lr_up)
        self._project()
        return losses

    def shared_descent(self, m: FedOTModel) -> list[torch.nn.Parameter]:
        return [q for q in m.predictor.parameters() if q.requires_grad] + list(m.psi.parameters())

    def round(self, data: Sequence[tuple], batches: Sequence[Sequence[torch.Tensor]]) -> float:
        """τ local iterations of every client (``batches[i][t]``: client i's indices at
        iteration t into ``data[i]``), then the sync; returns the mean task loss."""
        losses = []
        for m in self.models:
            m.train()
        for t in range(len(batches[0])):
            step = [self.task.batch(d, b[t]) for d, b in zip(data, batches, strict=True)]
            if self.params.gda_mode == "simultaneous":
                losses += self._simultaneous(step)
                continue
            self._ascent([b[0] for b in step])
            for m, batch in zip(self.models, step, strict=True):
                w = [q for q in m.predictor.parameters() if q.requires_grad]
                theta = list(m.psi.parameters())
                loss, _ = self.client.descend(m, self.task, batch, w, theta, self.lr, self.lr_map)
                losses.append(loss)
        self.sync()
        return float(np.mean(losses))

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
