"""FedOA (papers 000/001; spec fedoa.md §2): a global and a personal LoRA adapter per client.

Per round, client e (fedoa.md §2.3):
(a) personal adapter φ_e, K epochs of ``CE(φ_e; ξ) + λ·D(Φ(φ_e; ξ), stop_grad Φ(φ_g^{t-1}; ξ))``,
    teacher = the *round-start* global adapter on the same minibatch, no gradient through it;
(b) the client's copy of φ_g, K epochs of plain CE (exactly FedIT), uploaded.
The server is FedAvg (FedIT). φ_e never leaves the client and persists across rounds.

Switches (fedoa.md §8, defaults first): ``distance`` l2 (un-squared Frobenius per micro-batch,
§2.5) | l2_squared | l2_mean | mse | cosine | pearson | l1; ``feature_layer`` −1 (post-final-norm,
§2.4); ``feature_pool`` last | mean | response_mean | token; ``personal_init`` fresh | copy_global,
``personal_start_round`` 0 (paper) or 1 (authors' code) (§2.8); ``teacher_dropout`` off (§2.8);
``order`` personal_first (code) | global_first (invariant I4); ``global_update_mode`` local_epochs |
single_full_grad_step (Alg. 1 literally, §2.3 note 1).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from ..training.loop import minibatches, train_local
from .base import ClientAlgorithm, ClientContext, Method, MethodParams
from .feature_distance import Distance, Pool, feature_distance, pool_features
from .fedavg import FedAvg
from .registry import register

GLOBAL, PERSONAL = "global", "personal"


class FedOAParams(MethodParams):
    lam: float = Field(0.5, ge=0, alias="lambda", description="λ, weight of D (fedoa.md §2.2)")
    distance: Distance = "l2"
    feature_layer: int = -1
    feature_pool: Pool = "last"
    personal_init: Literal["fresh", "copy_global"] = "fresh"
    personal_start_round: int = Field(0, ge=0)
    teacher_dropout: bool = False
    order: Literal["personal_first", "global_first"] = "personal_first"
    global_update_mode: Literal["local_epochs", "single_full_grad_step"] = "local_epochs"
    train_global: bool = True
    log_feature_distance: bool = True

    model_config = {"populate_by_name": True}


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
        p, module = self.params, ctx.model.module

        def objective(batch: dict) -> torch.Tensor:
            if p.lam == 0:
                return module(**batch).loss
            g = self.teacher_features(ctx, batch)
            out, e = features(module, batch, p.feature_layer, p.feature_pool)
            return out.loss + p.lam * self.regularizer(e, g)

        return objective

    def train_personal(self, ctx: ClientContext) -> dict[str, float]:
        h = ctx.model
        if ctx.first_visit and self.params.personal_init == "copy_global":
            h.set_adapter(PERSONAL, h.get_adapter(GLOBAL))
        if ctx.dispatch_round < self.params.personal_start_round:
            return {}
        h.use(PERSONAL)
        params = h.adapter_parameters(PERSONAL)
        m = train_local(
            h.module,
            params,
            ctx.task,
            ctx.data,
            ctx.config,
            ctx.phase(PERSONAL),
            objective=self.personal_objective(ctx),
        )
        out = {"personal_train_loss": m["train_loss"]}
        if self.params.log_feature_distance:
            out["feature_distance"] = self.mean_distance(ctx)
        return out

    @torch.no_grad()
    def mean_distance(self, ctx: ClientContext) -> float:
        """Mean D(personal, global) over the client's data (fedoa.md §4.8 Fig. 2 diagnostic)."""
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
            h.set_adapter(GLOBAL, round_start)  # teacher = round-start global (fedoa.md §2.3)
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
    module, task, n = ctx.model.module, ctx.task, ctx.task.num_examples(ctx.data)
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


METHOD = register(
    Method(
        name="fedoa",
        strategy=FedAvg,
        params=FedOAParams,
        client=FedOAClient,
        adapters=(GLOBAL, PERSONAL),
        eval_adapter=PERSONAL,
        reference="FedOA (seeds 000/001); fedoa.md §2",
    )
)


class LocalOnlyParams(FedOAParams):
    lam: float = Field(0.0, ge=0, le=0, alias="lambda")


METHOD_LOCAL = register(
    Method(
        name="local_only",
        strategy=FedAvg,
        params=LocalOnlyParams,
        client=FedOAClient,
        adapters=(GLOBAL, PERSONAL),
        eval_adapter=PERSONAL,
        reference="Local-only personal adapters = FedOA with λ = 0; fedoa.md §3.7",
    )
)
