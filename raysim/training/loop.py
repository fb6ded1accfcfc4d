"""Plain-PyTorch local training: the default loop every client algorithm starts from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from raysim.training.tasks import Task


class LocalTrainingConfig(BaseModel):
    """How a client trains locally (identical for every method of a run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(1, ge=0)
    batch_size: int = Field(16, ge=1)
    lr: float = Field(0.05, gt=0)
    optimizer: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)


def make_optimizer(params: Sequence[torch.nn.Parameter], cfg: LocalTrainingConfig):
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def minibatches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One epoch of shuffled minibatch indices, drawn from ``generator`` only."""
    order = torch.randperm(n, generator=generator)
    return [order[s : s + batch_size] for s in range(0, n, batch_size)]


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
    """Mini-batch training of ``params`` for ``cfg.epochs`` epochs; returns the mean train loss.

    A fresh optimiser per call; shuffling uses ``generator`` only, so the result depends on nothing
    but the inputs. The step loss is ``objective(batch)`` (default: the task loss) plus
    ``penalty(params)``.
    """
    optimizer = make_optimizer(params, cfg)
    module.train()
    n = task.num_examples(data)
    total, steps = 0.0, 0
    for _ in range(cfg.epochs):
        for idx in minibatches(n, cfg.batch_size, generator):
            optimizer.zero_grad(set_to_none=True)
            batch = task.batch(data, idx)
            loss = objective(batch) if objective is not None else task.loss(module, batch)
            if penalty is not None:
                loss = loss + penalty(params)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            steps += 1
    return {"train_loss": total / steps if steps else float("nan"), "local_steps": float(steps)}


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int = 1024
) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on a labelled set."""
    model.eval()
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    correct, loss = 0, 0.0
    for start in range(0, len(targets), batch_size):
        x, y = inputs[start : start + batch_size], targets[start : start + batch_size]
        logits = model(x)
        loss += float(loss_fn(logits, y))
        correct += int((logits.argmax(dim=1) == y).sum())
    n = max(len(targets), 1)
    return {"accuracy": correct / n, "loss": loss / n}
