"""Local training: the one loop every client algorithm trains through, on a pluggable backend."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from raysim.training.backends import get_backend, micro_batches
from raysim.training.backends import make_optimizer as make_optimizer  # re-exported
from raysim.training.settings import DP_SGD_STEPS_METRIC, LocalTrainingConfig, total_optimizer_steps
from raysim.training.settings import DeepSpeedSettings as DeepSpeedSettings  # re-exported
from raysim.training.tasks import AbsentClassTask, ClassificationTask, Task, mask_absent


def minibatches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One epoch of shuffled minibatch indices, drawn from ``generator`` only."""
    order = torch.randperm(n, generator=generator)
    return [order[s : s + batch_size] for s in range(0, n, batch_size)]


def step_batches(
    n: int, cfg: LocalTrainingConfig, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """The example indices of every optimizer step of one local call, drawn lazily from
    ``generator`` only: ``cfg.epochs`` shuffled passes (``sampling: epochs``) or ``batch_size``
    distinct samples afresh per step (``independent``), at most ``total_optimizer_steps``.
    Every method that walks a client's data step by step shares this stream, so methods that
    coincide in theory (FedOT with λ = 0, FedAvg) see the same batches."""
    total = total_optimizer_steps(n, cfg)
    steps = 0
    if cfg.sampling == "independent":
        while steps < total:
            yield torch.randperm(n, generator=generator)[: cfg.batch_size]
            steps += 1
        return
    for _ in range(cfg.epochs):
        if steps == total:
            return
        for idx in minibatches(n, cfg.batch_size, generator):
            yield idx
            steps += 1
            if steps == total:
                return


def training_task(task: Task, data: Any, cfg: LocalTrainingConfig) -> Task:
    """The task whose loss local training on ``data`` minimises: ``task``, or for a classifier
    with ``cfg.absent_logits`` set, one that masks the classes ``data`` lacks."""
    if cfg.absent_logits != "keep" and isinstance(task, ClassificationTask):
        return AbsentClassTask(torch.unique(data[1]), cfg.absent_logits)
    return task


def train_local(
    module: torch.nn.Module,
    params: Sequence[torch.nn.Parameter],
    task: Task,
    data: Any,
    cfg: LocalTrainingConfig,
    generator: torch.Generator,
    penalty: Callable[[Sequence[torch.Tensor]], torch.Tensor] | None = None,
    objective: Callable[[Any], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Mini-batch training of ``params``, in place, through ``module`` on ``data``, as ``cfg``
    says (the steps of ``step_batches``: ``cfg.epochs``, at most ``cfg.max_steps``; optimiser and
    backend): what the default ``ClientAlgorithm.train`` runs, and what an override calls.

    ``params``: the tensors to train (``ctx.model.global_parameters()``, or a group's). A
    micro-batch's loss is ``objective(batch)`` (default: ``task``'s loss of ``module``) plus
    ``penalty(params)``. A fresh optimiser (and schedule) per call on ``cfg.backend``; shuffling
    uses ``generator`` only, so the result depends on nothing but the inputs. Each step's batch
    is split into ``cfg.grad_accumulation`` micro-batches, and the step's gradient is the mean
    over them (an epoch's short last batch has fewer). With ``cfg.dp_sgd`` the steps are
    DP-SGD's (refused with an ``objective``, which is not a sum over examples).

    Returns ``train_loss`` (the mean over steps of each step's micro-batch mean; NaN without a
    step) and ``local_steps`` (the optimiser steps taken), and with DP-SGD ``dp_sgd_steps``.
    """
    module.train()
    task = training_task(task, data, cfg)
    private = None
    if cfg.dp_sgd is not None:  # DP-SGD (raysim.training.dp_sgd)
        from raysim.training.dp_sgd import PrivateSteps

        if objective is not None:
            raise ValueError(
                "local.dp_sgd clips each example's gradient of the task loss; this method's "
                "objective is not a sum over examples"
            )
        private = PrivateSteps(module, params, task, cfg.dp_sgd, generator)
    n = task.num_examples(data)
    total_steps = total_optimizer_steps(n, cfg)
    if total_steps == 0:
        out = {"train_loss": float("nan"), "local_steps": 0.0}
        return out | ({DP_SGD_STEPS_METRIC: 0.0} if private is not None else {})
    stepper = get_backend(cfg.backend).prepare(module, params, cfg, total_steps)
    total, steps = 0.0, 0
    try:
        for idx in step_batches(n, cfg, generator):
            parts = list(micro_batches(idx, cfg))
            if private is not None:
                batches = [stepper.cast(task.batch(data, part)) for part in parts]
                total += private.step(batches, stepper, penalty)
                stepper.step()
                steps += 1
                continue
            step_loss = 0.0
            for i, part in enumerate(parts):
                batch = stepper.cast(task.batch(data, part))
                with stepper.forward_context():
                    loss = objective(batch) if objective is not None else task.loss(module, batch)
                    if penalty is not None:
                        loss = loss + stepper.penalty(penalty, params)
                step_loss += float(loss.detach())
                stepper.backward(loss / len(parts) if len(parts) > 1 else loss, i == len(parts) - 1)
            stepper.step()
            total += step_loss / len(parts)
            steps += 1
    finally:
        stepper.finish()
    out = {"train_loss": total / steps if steps else float("nan"), "local_steps": float(steps)}
    return out | ({DP_SGD_STEPS_METRIC: float(steps)} if private is not None else {})


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    batch_size: int = 1024,
    present: torch.Tensor | None = None,
    absent_logits: str = "keep",
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on a labelled set (with the logits of classes
    outside ``present`` masked, when ``absent_logits`` is not ``keep``)."""
    model.eval()
    device = next(model.parameters()).device
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    correct, loss = 0, 0.0
    for start in range(0, len(targets), batch_size):
        x = inputs[start : start + batch_size].to(device)
        y = targets[start : start + batch_size].to(device)
        logits = model(x)
        if present is not None and absent_logits != "keep":
            logits = mask_absent(logits, present, absent_logits)
        loss += float(loss_fn(logits, y))
        correct += int((logits.argmax(dim=1) == y).sum())
    n = max(targets.numel(), 1)  # per position for sequence targets (N, L)
    out = {"accuracy": correct / n, "loss": loss / n}
    if targets.ndim > 1:  # next-token prediction: exp(mean token NLL), FedBaF spec §4.5
        out["perplexity"] = math.exp(min(out["loss"], 50.0))
    return out


def local_accuracy(
    model: torch.nn.Module, client_labels: torch.Tensor, test: tuple[Any, Any], absent_logits: str
) -> float:
    """FedBaF spec §4.5: the trained local model on the test rows of the classes its client holds
    (the global test set with the client's class distribution, for equal per-class counts),
    absent logits masked as in training."""
    present = torch.unique(client_labels)
    x, y = (torch.as_tensor(a) for a in test)
    keep = torch.isin(y, present)
    if not bool(keep.any()):
        return float("nan")
    return evaluate(model, x[keep], y[keep], present=present, absent_logits=absent_logits)[
        "accuracy"
    ]
