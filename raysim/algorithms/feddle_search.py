"""Feddle's coefficient search (feddle.md §3.4, §3.7): minimise
``ℓ(D_S; ω + Σ c_m ā_m) + (λ/2)‖c − c'‖²`` over ``c`` with the stop-gradient gradient of App. E
(Eqs. 16–17): materialise ``ω' = ω + Āᵀc`` into the model, backpropagate once to get
``g = ∂ℓ/∂ω'``, and ``∂ℓ/∂c = Ā g``. No graph is ever built through the anchors, so Ā can live
on any device (or be sharded) and the cost is one ordinary backward pass per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ..training.tasks import Task


@dataclass(frozen=True)
class SearchConfig:
    """§3.7: optimiser on ``c`` (fresh every round), its learning rate η_g, epochs E_g, batch
    size, and the tie λ to the fallback coefficients ``c'`` (Eq. 11)."""

    lr: float = 1e-3
    epochs: int = 10
    batch_size: int = 32
    optimizer: Literal["adam", "sgd"] = "adam"
    lam: float = 0.0


def coefficient_gradient(
    module: torch.nn.Module,
    params: Sequence[torch.nn.Parameter],
    task: Task,
    batch: Any,
    base: torch.Tensor,
    anchors: torch.Tensor,
    c: torch.Tensor,
) -> tuple[torch.Tensor, float]:
    """``(∂ℓ(batch; base + anchorsᵀ c)/∂c, loss)`` by Eqs. 16–17 (I-9 checks it against autograd
    through the anchors). ``params`` are the module's tensors that ``base`` flattens."""
    with torch.no_grad():
        vector_to_parameters(base + anchors.T @ c, params)
    for p in params:
        p.grad = None
    loss = task.loss(module, batch)
    loss.backward()
    g = parameters_to_vector(
        [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    )
    return anchors @ g, float(loss.detach())


def full_gradient(
    module: torch.nn.Module,
    params: Sequence[torch.nn.Parameter],
    task: Task,
    data: Any,
    base: torch.Tensor,
    anchors: torch.Tensor,
    c: torch.Tensor,
    batch_size: int,
) -> torch.Tensor:
    """``∂ℓ(data)/∂c`` over all of ``data`` (example-weighted mean of the batch gradients)."""
    n = task.num_examples(data)
    total = torch.zeros_like(c)
    for start in range(0, n, batch_size):
        idx = torch.arange(start, min(n, start + batch_size))
        grad, _ = coefficient_gradient(
            module, params, task, task.batch(data, idx), base, anchors, c
        )
        total += grad * len(idx)
    return total / max(n, 1)


def search_flops(
    module: torch.nn.Module,
    params: Sequence[torch.nn.Parameter],
    task: Task,
    data: Any,
    base: torch.Tensor,
    anchors: torch.Tensor,
    c: torch.Tensor,
    config: SearchConfig,
) -> float:
    """FLOPs of one round's search (Table 6): one step counted by torch's ``FlopCounterMode``
    (forward and backward on one batch), plus ``Āᵀc`` and ``Ā g`` (2·|A|·d multiply-adds each),
    times the number of steps."""
    from torch.utils.flop_counter import FlopCounterMode

    n = task.num_examples(data)
    batch = task.batch(data, torch.arange(min(n, config.batch_size)))
    counter = FlopCounterMode(display=False)
    with counter:
        coefficient_gradient(module, params, task, batch, base, anchors, c)
    steps = config.epochs * -(-n // config.batch_size)
    return float(steps * (counter.get_total_flops() + 4 * anchors.numel()))


def mean_loss(module: torch.nn.Module, task: Task, data: Any, batch_size: int) -> float:
    """The loss over all of ``data`` (example-weighted), without gradients."""
    n = task.num_examples(data)
    total = 0.0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            idx = torch.arange(start, min(n, start + batch_size))
            total += float(task.loss(module, task.batch(data, idx))) * len(idx)
    return total / max(n, 1)


def search(
    module: torch.nn.Module,
    params: Sequence[torch.nn.Parameter],
    task: Task,
    data: Any,
    base: torch.Tensor,
    anchors: torch.Tensor,
    c_init: torch.Tensor,
    c_fallback: torch.Tensor,
    config: SearchConfig,
    generator: torch.Generator,
) -> torch.Tensor:
    """Run the search from ``c_init``; the final coefficients ĉ. The module is in ``eval()`` mode
    throughout (§3.7: BatchNorm uses its running statistics, dropout is off) and is left holding
    ``base + anchorsᵀ ĉ``."""
    was_training = module.training
    module.eval()
    c = c_init.detach().clone().requires_grad_(True)
    if config.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam([c], lr=config.lr)
    else:
        opt = torch.optim.SGD([c], lr=config.lr)
    n = task.num_examples(data)
    try:
        for _ in range(config.epochs):
            order = torch.randperm(n, generator=generator)
            for start in range(0, n, config.batch_size):
                batch = task.batch(data, order[start : start + config.batch_size])
                grad, _ = coefficient_gradient(
                    module, params, task, batch, base, anchors, c.detach()
                )
                c.grad = grad + config.lam * (c.detach() - c_fallback)
                opt.step()
        with torch.no_grad():
            vector_to_parameters(base + anchors.T @ c.detach(), params)
    finally:
        module.train(was_training)
    return c.detach()
