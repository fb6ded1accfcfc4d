"""pFedMe (T. Dinh, Tran, Nguyen 2020, "Personalized federated learning with Moreau envelopes");
FedOA spec §3.3 (and §2.13 for the authors'-code mode). Runs on any model: on a causal LM w and θ
are two LoRA adapters; on a plain module w is the module's trainable tensors and θ a personal copy
of them (``ModelHandle``; BatchNorm statistics stay shared).

Standard mode (default). Client e holds a personal model θ_e (persisted, never uploaded) and
trains its copy w_e ← w^{t-1} of the global model. For each local minibatch ξ (K epochs):
1. θ̃ ≈ argmin_θ f(θ; ξ) + (λ_p/2)‖θ − w_e‖² by ``inner_steps`` optimiser steps of lr η_p on the
   same ξ, warm-started from the current θ_e (which becomes θ̃);
2. outer step w_e ← w_e − η λ_p (w_e − θ̃) (a plain step, as in pFedMe).
w_e is uploaded; the server keeps w^t = (1 − β) w^{t-1} + β Σ α̃_e w_e (``PFedMeServer``; β = 1 is
FedAvg bit for bit). θ_e answers for a known client.
[I] Each inner solve is one ``train_local`` call (K_in epochs over that one minibatch, the run's
``local`` optimiser, micro-batching, clipping and precision, lr η_p), so the optimiser state and lr
schedule restart for every minibatch (pFedMe's own inner solver is stateless SGD; with SGD and a
constant schedule this is exactly it); the outer step is a plain, unclipped step. The logged
``train_loss`` is the mean inner objective (task loss + prox), ``param_distance`` = ‖θ_e − w_e‖₂.

Authors'-code mode (``authors_code = true``, FedOA spec §3.3 last bullet, §2.13): round index 0
trains only the global copy, FedIT-style; from round index 1 the personal model is trained K epochs
on the task loss plus the detached (gradient-free) penalty λ Σ_tensors ‖θ_p − w‖₂ / 32, then the
global copy takes one step w ← w − 2·λ·η·(w − θ_p) with no data pass (θ_p = this round's trained
personal model).

Switches (defaults first, all [proposal] unless noted):
- ``lambda`` (alias ``lam``) λ_p: 15 (pFedMe paper default) in standard mode, 0.5 (the authors'
  ``regular_weight``) in authors'-code mode;
- ``inner_steps`` K_in = 5; ``beta`` β = 1.0 (server, > 0);
- ``lr_personal`` η_p and ``lr_global`` η: default the local lr (``local.lr``);
- ``personal_init`` fresh (FedOA spec §2.8 default) | copy_global (θ_e ← w on the first visit);
- ``authors_code`` false | true.
"""

from __future__ import annotations

import numpy as np
import torch

from ...training.loop import minibatches, train_local
from ..base import ClientAlgorithm, ClientContext, Method
from ..general.fedavg import RoundBuffer
from ..registry import register
from .params import METHODS, PFedMeParams
from .personal import (
    GLOBAL,
    PERSONAL,
    PERSONAL_GROUPS,
    detached_code_penalty,
    param_distance,
    squared_distance,
    task_loss,
)


class PFedMeServer(RoundBuffer):
    """w^t = w^{t-1} + β · Σ α̃_e (w_e − w^{t-1}) = (1 − β) w^{t-1} + β Σ α̃_e w_e."""

    params: PFedMeParams

    def on_round_end(self, round_index: int) -> bool:
        delta = self.round_delta()
        self.pending = []
        if delta is not None:
            beta = self.params.beta
            self.weights = self.weights + (delta if beta == 1 else np.float32(beta) * delta)
        return True


class PFedMeClient(ClientAlgorithm):
    params: PFedMeParams

    def train(self, ctx: ClientContext) -> dict[str, float]:
        h = ctx.model
        if ctx.first_visit and self.params.personal_init == "copy_global":
            h.set_adapter(PERSONAL, h.get_adapter(GLOBAL))
        metrics = self.train_code(ctx) if self.params.authors_code else self.train_standard(ctx)
        h.use(GLOBAL)
        return metrics

    def train_standard(self, ctx: ClientContext) -> dict[str, float]:
        p, h, task = self.params, ctx.model, ctx.task
        lam = p.lambda_p
        eta = p.lr_global or ctx.config.lr
        theta, w = h.adapter_parameters(PERSONAL), h.adapter_parameters(GLOBAL)
        h.use(PERSONAL)
        inner = ctx.config.model_copy(
            update={"epochs": p.inner_steps, "lr": p.lr_personal or ctx.config.lr}
        )
        generator = ctx.phase(None)
        within = torch.Generator().manual_seed(ctx.seed)  # row order inside a minibatch only
        loss = task_loss(ctx)  # the client's loss (a classifier's absent classes: all its data)
        n = task.num_examples(ctx.data)
        total, steps = 0.0, 0
        for _ in range(ctx.config.epochs):
            for idx in minibatches(n, ctx.config.batch_size, generator):
                centre = [q.detach().clone() for q in w]

                def prox(params, centre=centre):
                    return 0.5 * lam * squared_distance(params, centre)

                sub = task.batch(ctx.data, idx)
                m = train_local(
                    h.module, theta, task, sub, inner, within, penalty=prox, objective=loss
                )
                with torch.no_grad():
                    for q, t in zip(w, theta, strict=True):
                        q -= eta * lam * (q - t)
                total += m["train_loss"]
                steps += 1
        return {
            "train_loss": total / steps if steps else float("nan"),
            "local_steps": float(steps),
            "param_distance": param_distance(ctx),
        }

    def train_code(self, ctx: ClientContext) -> dict[str, float]:
        """The authors' code: FedIT in round index 0, then CE personal + one global step."""
        h, lam = ctx.model, self.params.lambda_p
        if ctx.dispatch_round < 1:
            h.use(GLOBAL)
            params = h.adapter_parameters(GLOBAL)
            return train_local(h.module, params, ctx.task, ctx.data, ctx.config, ctx.phase(None))
        theta, w = h.adapter_parameters(PERSONAL), h.adapter_parameters(GLOBAL)
        centre = [q.detach().clone() for q in w]

        def penalty(params) -> float:  # a float: no gradient
            return lam * detached_code_penalty(params, centre)

        h.use(PERSONAL)
        m = train_local(
            h.module, theta, ctx.task, ctx.data, ctx.config, ctx.phase(PERSONAL), penalty=penalty
        )
        eta = self.params.lr_global or ctx.config.lr
        with torch.no_grad():
            for q, t in zip(w, theta, strict=True):
                q -= 2 * lam * eta * (q - t)
        return {"personal_train_loss": m["train_loss"], "param_distance": param_distance(ctx)}


METHOD = register(
    Method.of(
        METHODS["pfedme"],
        strategy=PFedMeServer,
        client=PFedMeClient,
        groups=PERSONAL_GROUPS,
        evaluate_with=PERSONAL,
    )
)
