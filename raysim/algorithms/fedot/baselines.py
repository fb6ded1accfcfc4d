"""FedOT's personalisation baselines (FedOT spec §5), each with its own evaluation rule.

- ``l_fedavg``: FedAvg; before a client is evaluated it fine-tunes the global model for
  ``finetune_steps`` local SGD iterations on its own data (500 [P]) and is scored with that copy.
- ``fed_fomaml`` (Per-FedAvg, first order; Fallah et al. 2020 [S]): a local step takes a batch D,
  w̃ = w − α∇f(w; D), then a fresh batch D', w ← w − β∇f(w̃; D'); the server is FedAvg. Evaluation
  adapts with ``eval_steps`` step(s) w − α∇f(w; batch) (one [S]).
- ``fedmi`` (Mansour et al. 2020, model interpolation): the global model is FedAvg's; each client
  also trains a local model on its own data only (the same steps, the ``personal`` copy, exactly
  as ``local_only``); it predicts with ``α·softmax(f_local) + (1−α)·softmax(f_w)`` (``space:
  output``, the default [D]) or with the parameter mix ``α·local + (1−α)·w`` (``param``).

All three run on any classifier; α, β and the fine-tuning lr default to ``local.lr`` (§6.4 [D]).
"""

from __future__ import annotations

import torch

from ...models.layout import ParamGroup
from ...training.loop import step_batches, train_local, training_task
from ...training.settings import total_optimizer_steps
from ..base import ClientAlgorithm, ClientContext, Method
from ..general.fedavg import FedAvg
from ..registry import register
from .client import sgd
from .params import METHODS, FedMIParams, FOMAMLParams, LFedAvgParams

GLOBAL, PERSONAL = "global", "personal"


class LFedAvgClient(ClientAlgorithm):
    """FedAvg's client; ``adapt`` fine-tunes the global model on the client's data."""

    params: LFedAvgParams

    def adapt(self, ctx: ClientContext) -> None:
        steps = self.params.finetune_steps
        if steps == 0:
            return
        update = {"max_steps": steps, "epochs": steps}
        if self.params.finetune_lr is not None:
            update["lr"] = self.params.finetune_lr
        cfg = ctx.config.model_copy(update=update)
        h = ctx.model
        train_local(h.module, h.global_parameters(), ctx.task, ctx.data, cfg, ctx.phase("adapt"))


class FOMAMLClient(ClientAlgorithm):
    """Each of the τ local steps uses two consecutive batches of the client's step stream."""

    params: FOMAMLParams

    def rates(self, ctx: ClientContext) -> tuple[float, float]:
        p, lr = self.params, ctx.config.lr
        return (lr if p.alpha is None else p.alpha), (lr if p.beta is None else p.beta)

    def train(self, ctx: ClientContext) -> dict[str, float]:
        alpha, beta = self.rates(ctx)
        cfg, h = ctx.config, ctx.model
        task = training_task(ctx.task, ctx.data, cfg)
        n = task.num_examples(ctx.data)
        steps = total_optimizer_steps(n, cfg)
        doubled = cfg.model_copy(update={"max_steps": 2 * steps, "epochs": 2 * max(cfg.epochs, 1)})
        stream = step_batches(n, doubled, ctx.generator)
        params = h.global_parameters()
        h.module.train()
        losses = []
        for first, second in zip(stream, stream, strict=False):
            start = [q.detach().clone() for q in params]
            inner = task.loss(h.module, task.batch(ctx.data, first))
            sgd(params, torch.autograd.grad(inner, params), alpha)  # w̃ = w − α∇f(w; D)
            outer = task.loss(h.module, task.batch(ctx.data, second))
            grads = torch.autograd.grad(outer, params)  # ∇f(w̃; D'), first order
            with torch.no_grad():
                for q, q0 in zip(params, start, strict=True):
                    q.copy_(q0)
            sgd(params, grads, beta)
            losses.append(float(outer.detach()))
        mean = sum(losses) / len(losses) if losses else float("nan")
        return {"train_loss": mean, "local_steps": float(len(losses))}

    def adapt(self, ctx: ClientContext) -> None:
        alpha, _ = self.rates(ctx)
        steps = self.params.eval_steps
        if steps == 0 or alpha == 0:
            return
        cfg = ctx.config.model_copy(update={"max_steps": steps, "epochs": steps})
        task = training_task(ctx.task, ctx.data, cfg)
        h = ctx.model
        params = h.global_parameters()
        h.module.train()
        for idx in step_batches(task.num_examples(ctx.data), cfg, ctx.phase("adapt")):
            loss = task.loss(h.module, task.batch(ctx.data, idx))
            sgd(params, torch.autograd.grad(loss, params), alpha)


class OutputMixture(torch.nn.Module):
    """log(α·softmax(f_local(x)) + (1−α)·softmax(f_w(x))): the answer of a FedMI client (its
    log-probabilities, so accuracy and cross-entropy read it as logits)."""

    def __init__(self, handle, alpha: float) -> None:
        super().__init__()
        self.inner = handle.module
        self.handle = handle
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.handle.use(GLOBAL)
        p_global = torch.softmax(self.inner(x), dim=-1)
        self.handle.use(PERSONAL)
        p_local = torch.softmax(self.inner(x), dim=-1)
        return torch.log(self.alpha * p_local + (1.0 - self.alpha) * p_global)


class FedMIClient(ClientAlgorithm):
    """Trains the local copy (its own stream, exactly ``local_only``'s) and FedAvg's copy."""

    params: FedMIParams

    def train(self, ctx: ClientContext) -> dict[str, float]:
        h = ctx.model
        h.use(PERSONAL)
        local = train_local(
            h.module,
            h.group_parameters(PERSONAL),
            ctx.task,
            ctx.data,
            ctx.config,
            ctx.phase(PERSONAL),
        )
        h.use(GLOBAL)
        out = train_local(
            h.module, h.global_parameters(), ctx.task, ctx.data, ctx.config, ctx.phase(None)
        )
        return {**out, "personal_train_loss": local["train_loss"]}

    def adapt(self, ctx: ClientContext) -> torch.nn.Module | None:
        a, h = self.params.alpha, ctx.model
        if self.params.space == "output":
            return OutputMixture(h, a)
        mixed = a * h.get_group(PERSONAL) + (1.0 - a) * h.get_group(GLOBAL)
        h.set_group(PERSONAL, mixed.astype("float32"))
        return None


TWO_COPIES = (ParamGroup(GLOBAL, "shared"), ParamGroup(PERSONAL, "personal"))

L_FEDAVG = register(Method.of(METHODS["l_fedavg"], strategy=FedAvg, client=LFedAvgClient))
FED_FOMAML = register(Method.of(METHODS["fed_fomaml"], strategy=FedAvg, client=FOMAMLClient))
FEDMI = register(
    Method.of(
        METHODS["fedmi"],
        strategy=FedAvg,
        client=FedMIClient,
        groups=TWO_COPIES,
        evaluate_with=PERSONAL,
    )
)
