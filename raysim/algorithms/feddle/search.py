"""Feddle's coefficient search (Feddle spec §3.4, §3.7): minimise
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

from ...training.tasks import Task


@dataclass(frozen=True)
class SearchConfig:
    """§3.7: optimiser on ``c`` (fresh every round), its learning rate η_g, epochs E_g, batch
    size, and the tie λ to the fallback coefficients ``c'`` (Eq. 11). ``tie_step`` (SGD only):
    ``explicit``, the gradient of (λ/2)‖c − c'‖² in the step (stable for η_g·λ < 2); or
    ``proximal``, that term's exact proximal step, c ← (c − η_g∇ℓ + η_g·λ·c') / (1 + η_g·λ),
    stable for any λ and equal to c' as λ → ∞."""

    lr: float = 1e-3
    epochs: int = 10
    batch_size: int = 32
    optimizer: Literal["adam", "sgd"] = "adam"
    lam: float = 0.0
    tie_step: Literal["explicit", "proximal"] = "explicit"


@dataclass(frozen=True)
class Objective:
    """What a search runs on: the model (``params`` are its tensors that ``base`` flattens), the
    loss (``task``) on ``data``, and the anchor matrix Ā (|A| × d) on the same device."""

    module: torch.nn.Module
    params: Sequence[torch.nn.Parameter]
    task: Task
    data: Any
    base: torch.Tensor
    anchors: torch.Tensor

    def place(self, c: torch.Tensor) -> None:
        """Materialise ``ω' = base + Āᵀc`` into the model (no graph)."""
        with torch.no_grad():
            vector_to_parameters(self.base + self.anchors.T @ c, self.params)

    def gradient(self, batch: Any, c: torch.Tensor) -> tuple[torch.Tensor, float]:
        """``(∂ℓ(batch; ω')/∂c, loss)`` by Eqs. 16–17 (I-9 checks it against autograd through
        the anchors)."""
        self.place(c)
        for p in self.params:
            p.grad = None
        loss = self.task.loss(self.module, batch)
        loss.backward()
        g = parameters_to_vector(
            [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        )
        return self.anchors @ g, float(loss.detach())

    def full_gradient(self, c: torch.Tensor, batch_size: int) -> torch.Tensor:
        """``∂ℓ(data)/∂c`` over all of the data (example-weighted mean of batch gradients)."""
        n = self.task.num_examples(self.data)
        total = torch.zeros_like(c)
        for start in range(0, n, batch_size):
            idx = torch.arange(start, min(n, start + batch_size))
            total += self.gradient(self.task.batch(self.data, idx), c)[0] * len(idx)
        return total / max(n, 1)

    def loss(self, c: torch.Tensor, batch_size: int) -> float:
        """The loss at ``c`` over all of the data, without gradients."""
        self.place(c)
        return mean_loss(self.module, self.task, self.data, batch_size)

    def flops(self, c: torch.Tensor, config: SearchConfig) -> float:
        """FLOPs of one round's search (Table 6): one step counted by torch's
        ``FlopCounterMode`` (forward and backward on one batch), plus ``Āᵀc`` and ``Ā g``
        (2·|A|·d multiply-adds each), times the number of steps."""
        from torch.utils.flop_counter import FlopCounterMode

        n = self.task.num_examples(self.data)
        batch = self.task.batch(self.data, torch.arange(min(n, config.batch_size)))
        counter = FlopCounterMode(display=False)
        with counter:
            self.gradient(batch, c)
        steps = config.epochs * -(-n // config.batch_size)
        return float(steps * (counter.get_total_flops() + 4 * self.anchors.numel()))


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
    objective: Objective,
    c_init: torch.Tensor,
    c_fallback: torch.Tensor,
    config: SearchConfig,
    generator: torch.Generator,
) -> torch.Tensor:
    """Run the search from ``c_init``; the final coefficients ĉ. The module is in ``eval()`` mode
    throughout (§3.7: BatchNorm uses its running statistics, dropout is off) and is left holding
    ``base + Āᵀĉ``."""
    module = objective.module
    was_training = module.training
    module.eval()
    c = c_init.detach().clone().requires_grad_(True)
    if config.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam([c], lr=config.lr)
    else:
        opt = torch.optim.SGD([c], lr=config.lr)
    task, data = objective.task, objective.data
    n = task.num_examples(data)
    try:
        for _ in range(config.epochs):
            order = torch.randperm(n, generator=generator)
            for start in range(0, n, config.batch_size):
                batch = task.batch(data, order[start : start + config.batch_size])
                grad, _ = objective.gradient(batch, c.detach())
                if config.tie_step == "proximal" and config.optimizer == "sgd":
                    step = config.lr * config.lam
                    with torch.no_grad():
                        c.copy_((c - config.lr * grad + step * c_fallback) / (1.0 + step))
                    continue
                c.grad = grad + config.lam * (c.detach() - c_fallback)
                opt.step()
        objective.place(c.detach())
    finally:
        module.train(was_training)
    return c.detach()
