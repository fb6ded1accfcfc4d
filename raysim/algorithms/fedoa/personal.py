"""What the personalised methods share: FedOA's two-phase client and its helpers.

Every method here keeps two parameter groups on the resident model, ``GLOBAL`` (trained
FedIT-style, uploaded, averaged) and ``PERSONAL`` (never leaves the client, answers for a known
client): two LoRA adapters on a causal LM, or on a plain module the module's trainable tensors and
a personal copy of them (``ModelHandle``; buffers such as BatchNorm statistics stay shared):

- ``FedOAParams`` / ``FedOAClient``: FedOA's client (FedOA spec §2.3): per round the personal
  adapter with ``CE + λ·R(E, G)`` against the round-start global adapter's features, then the
  global copy with plain CE (exactly FedIT); ``regularizer`` is the term subclasses swap (FedOA,
  Local-only, FedSDR);
- ``ParamProxClient``: the same client with the feature term replaced by a parameter penalty
  (Ditto, PerAda), plus ``squared_distance`` and ``param_distance``;
- ``detached_code_penalty``: the authors'-code gradient-free prox term (FedOA spec §2.13; PerAda,
  pFedMe).

Method files import these from here, never from each other; each method registers itself in its
own file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...models.layout import ParamGroup
from ...training.backends import PenaltyFn
from ...training.loop import minibatches, train_local, training_task
from ..base import ClientAlgorithm, ClientContext
from .feature_distance import Pool, feature_distance, pool_features
from .params import FedOAParams

GLOBAL, PERSONAL = "global", "personal"
#: FedOA-style methods: a shared global adapter and a personal one (FedOA spec §2.1)
PERSONAL_GROUPS = (ParamGroup(GLOBAL, "shared"), ParamGroup(PERSONAL, "personal"))

#: a loss on one batch (``train_local``'s ``objective``)
Objective = Callable[[Any], torch.Tensor]


def task_loss(ctx: ClientContext) -> Objective:
    """The client's training loss on one batch, as ``train_local`` computes it by default (on a
    causal LM ``module(**batch).loss``)."""
    module, task = ctx.model.module, training_task(ctx.task, ctx.data, ctx.config)
    return lambda batch: task.loss(module, batch)


def features(module: torch.nn.Module, batch: dict, layer: int, pool: Pool):
    """(model output, pooled features of hidden layer ``layer``) for one batch."""
    out = module(**batch, output_hidden_states=True)
    feats = pool_features(out.hidden_states[layer], batch["attention_mask"], batch["labels"], pool)
    return out, feats


class FedOAClient(ClientAlgorithm):
    """Trains the personal adapter (feature-regularised) and the global copy (plain CE)."""

    params: FedOAParams

    def teacher_features(self, ctx: ClientContext, batch: dict) -> torch.Tensor:
        """Φ(φ_g^{t-1}; ξ): global adapter active, no grad, dropout off unless configured."""
        p, h, module = self.params, ctx.model, ctx.model.module
        h.use(GLOBAL)
        was_training = module.training
        if not p.teacher_dropout:
            module.eval()
        with torch.no_grad():
            _, g = features(module, batch, p.feature_layer, p.feature_pool)
        module.train(was_training)
        h.use(PERSONAL)
        return g.detach()

    def regularizer(self, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The feature term R(E, G) weighted by λ: FedOA's distance D (subclasses swap it)."""
        return feature_distance(e, g, self.params.distance)

    def personal_objective(self, ctx: ClientContext):
        p, module, loss = self.params, ctx.model.module, task_loss(ctx)

        def objective(batch: dict) -> torch.Tensor:
            if p.lam == 0:
                return loss(batch)
            g = self.teacher_features(ctx, batch)
            out, e = features(module, batch, p.feature_layer, p.feature_pool)
            return out.loss + p.lam * self.regularizer(e, g)

        return objective

    def personal_terms(self, ctx: ClientContext) -> tuple[Objective | None, PenaltyFn | None]:
        """What the personal phase gives ``train_local``: (``objective``, ``penalty``)."""
        return self.personal_objective(ctx), None

    def train_personal(self, ctx: ClientContext) -> dict[str, float]:
        h = ctx.model
        if ctx.first_visit and self.params.personal_init == "copy_global":
            h.set_adapter(PERSONAL, h.get_adapter(GLOBAL))
        if ctx.dispatch_round < self.params.personal_start_round:
            return {}
        h.use(PERSONAL)
        params = h.adapter_parameters(PERSONAL)
        objective, penalty = self.personal_terms(ctx)
        m = train_local(
            h.module,
            params,
            ctx.task,
            ctx.data,
            ctx.config,
            ctx.phase(PERSONAL),
            penalty=penalty,
            objective=objective,
        )
        out = {"personal_train_loss": m["train_loss"]}
        if self.params.log_feature_distance and h.has_hidden_states:
            out["feature_distance"] = self.mean_distance(ctx)
        return out

    @torch.no_grad()
    def mean_distance(self, ctx: ClientContext) -> float:
        """Mean D(personal, global) over the client's data (FedOA spec §4.8 Fig. 2 diagnostic)."""
        p, h, module = self.params, ctx.model, ctx.model.module
        module.eval()
        total, n = 0.0, ctx.task.num_examples(ctx.data)
        for idx in torch.arange(n).split(ctx.config.batch_size):
            batch = ctx.task.batch(ctx.data, idx)
            h.use(GLOBAL)
            _, g = features(module, batch, p.feature_layer, p.feature_pool)
            h.use(PERSONAL)
            _, e = features(module, batch, p.feature_layer, p.feature_pool)
            total += float(feature_distance(e, g, p.distance)) * len(idx)
        module.train()
        return total / max(n, 1)

    def train_global(self, ctx: ClientContext) -> dict[str, float]:
        h = ctx.model
        h.use(GLOBAL)
        params = h.adapter_parameters(GLOBAL)
        generator = ctx.phase(None)  # the job's own streams: the global path is exactly FedIT's
        if self.params.global_update_mode == "single_full_grad_step":
            return full_gradient_step(ctx, params, generator)
        return train_local(h.module, params, ctx.task, ctx.data, ctx.config, generator)

    def train(self, ctx: ClientContext) -> dict[str, float]:
        h = ctx.model
        round_start = h.get_adapter(GLOBAL)
        metrics: dict[str, float] = {}
        if self.params.order == "global_first" and self.params.train_global:
            metrics.update(self.train_global(ctx))
            trained = h.get_adapter(GLOBAL)
            h.set_adapter(GLOBAL, round_start)  # teacher = round-start global (FedOA spec §2.3)
            metrics.update(self.train_personal(ctx))
            h.set_adapter(GLOBAL, trained)
        else:
            metrics.update(self.train_personal(ctx))
            if self.params.train_global:
                metrics.update(self.train_global(ctx))
        h.use(GLOBAL)
        return metrics


def full_gradient_step(
    ctx: ClientContext, params: list[torch.nn.Parameter], generator: torch.Generator
) -> dict[str, float]:
    """φ ← φ − η ∇R_e(φ) with the full-batch gradient (Algorithm 1 line 10 read literally)."""
    module, n = ctx.model.module, ctx.task.num_examples(ctx.data)
    task = training_task(ctx.task, ctx.data, ctx.config)
    for q in params:
        q.grad = None
    total = 0.0
    for idx in minibatches(n, ctx.config.batch_size, generator):
        loss = task.loss(module, task.batch(ctx.data, idx)) * (len(idx) / n)
        loss.backward()
        total += float(loss.detach())
    with torch.no_grad():
        for q in params:
            q -= ctx.config.lr * q.grad
            q.grad = None
    return {"train_loss": total, "local_steps": 1.0}


def squared_distance(params, centre) -> torch.Tensor:
    """Σ_tensors ‖p − c‖² (differentiable in ``params``; ``centre`` is a detached snapshot)."""
    return sum(((p - c) ** 2).sum() for p, c in zip(params, centre, strict=True))


def param_distance(ctx: ClientContext) -> float:
    """‖v − φ_g‖₂ between the personal and global groups (flat vectors, float64)."""
    h = ctx.model
    diff = h.get_adapter(PERSONAL).astype(np.float64) - h.get_adapter(GLOBAL)
    return float(np.linalg.norm(diff))


class ParamProxClient(FedOAClient):
    """FedOA's two-phase client with the feature term replaced by a parameter penalty.

    Subclasses give ``penalty_fn(ctx)``: a closure computing the (differentiable) penalty on the
    personal group, or None for none. The closure is built at the start of the personal phase,
    so it may snapshot the round-start global group.
    """

    def penalty_fn(self, ctx: ClientContext) -> Callable[[], torch.Tensor | float] | None:
        raise NotImplementedError

    def personal_objective(self, ctx: ClientContext):
        """The personal phase's loss on one batch, summed: task loss + penalty (training gives
        ``train_local`` the two parts, ``personal_terms``)."""
        loss, penalty = task_loss(ctx), self.penalty_fn(ctx)
        return loss if penalty is None else lambda batch: loss(batch) + penalty()

    def personal_terms(self, ctx: ClientContext) -> tuple[Objective | None, PenaltyFn | None]:
        """The same sum, with the penalty as ``train_local``'s (so that a backend sees it: ZeRO-3
        gathers the personal tensors it reads)."""
        penalty = self.penalty_fn(ctx)
        return None, None if penalty is None else lambda params: penalty()

    def train_personal(self, ctx: ClientContext) -> dict[str, float]:
        out = super().train_personal(ctx)
        if out:
            out["param_distance"] = param_distance(ctx)
        return out


#: The authors' code divides the summed per-tensor norms by 32 (LLaMA-7B's layer count).
CODE_NORM_DIVISOR = 32.0


def detached_code_penalty(personal, centre) -> float:
    """Σ_tensors ‖θ_p − θ_g‖₂ / 32 as a float (the authors' ``.item()`` form, no gradient)."""
    with torch.no_grad():
        total = sum(
            float(torch.linalg.vector_norm(p - c)) for p, c in zip(personal, centre, strict=True)
        )
    return total / CODE_NORM_DIVISOR
