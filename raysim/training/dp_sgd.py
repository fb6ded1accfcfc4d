"""Sample-level DP-SGD inside a client (Abadi et al. 2016, "Deep Learning with Differential
Privacy", https://arxiv.org/abs/1607.00133), for ``local.dp_sgd``.

Each step's ``b`` examples (``local.sampling: independent``: drawn afresh without replacement)
give one gradient each; every one is clipped to L2 norm C over all trained tensors, the clipped
gradients are summed, Gaussian noise N(0, (z·C)²) is added to the sum once, and the result is
divided by ``b``: g̃ = (Σ_i clip_C(g_i) + N(0, z²C²·I)) / b. A ``penalty`` (FedProx's proximal
term) reads no data, so its gradient is added unclipped and un-noised.

Per-example gradients, by model:

- A plain classifier that is a ``Sequential`` chain (``raysim.training.chain``) of ``Linear``,
  ``Conv2d``, pooling, ``Flatten`` and elementwise layers, trained whole (the quickstart's MLP,
  a small CNN): one forward, one backward to the layers' outputs, and per layer an einsum. A
  linear layer's gradient is the outer product δ_i a_iᵀ of its output's gradient and its input
  (Goodfellow 2015, "Efficient Per-Example Gradient Computations",
  https://arxiv.org/abs/1510.01799): its norm is ‖δ_i‖·‖a_i‖ and the clipped sum Σ_i c_i δ_i
  a_iᵀ, never formed per example. A convolution's is δ_i times its unfolded input (Opacus's rule),
  formed per example (b copies of its weight). This skips Opacus's module hooks and
  ``torch.func``'s ``vmap`` overhead, and is faster than Opacus's ``GradSampleModule`` on one
  client (``benchmarks/privacy.py``). A batched group takes it for k stacked clients on linear
  chains only (``conv2d`` and the pools take no clients' axis); a linear layer that sees a
  sequence (more than one row per example), where the norm rule fails, falls to the next path.
- Any other model: ``torch.func`` (``functional_call`` + ``vmap(grad)``), not Opacus's hooks: the
  batched pass (``raysim.training.batched``) already stacks k clients' parameters on a leading
  axis and ``vmap``s over them, and per-example gradients are one more ``vmap`` inside it;
  Opacus's hooks see one module's activations and cannot be nested in a stacked functional call.
- A model that does not run under ``vmap`` (a transformers model): example by example (one
  backward each), the same numbers, more time.

The noise comes from a generator of its own, seeded from the job's seed (``noise_generator``):
the batches are those the client would draw without DP, and one client's noise is the same
trained alone or in a batched group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from raysim.training.chain import Layer, chain_forward, linear_chain
from raysim.training.settings import DpSgdSettings
from raysim.training.tasks import ClassificationTask, Task

#: mixed with the job's seed for its noise stream
NOISE_TAG = 0xD95D
#: clip's guard against a zero norm, as Opacus writes it
EPS = 1e-6


def noise_generator(generator: torch.Generator) -> torch.Generator:
    """The job's noise stream, apart from its batches: seeded from ``generator``'s seed (the
    job's) and a constant, drawing nothing from ``generator``."""
    seed = np.random.SeedSequence([generator.initial_seed(), NOISE_TAG]).generate_state(2)
    return torch.Generator().manual_seed(int(seed[0]) << 32 | int(seed[1]))


def refusal(module: nn.Module) -> str:
    """Why ``module`` cannot train with per-example clipping ("" when it can)."""
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            return (
                "local.dp_sgd: BatchNorm mixes a batch's examples, so an example's gradient is "
                "not its own; use a model with GroupNorm or LayerNorm"
            )
    return ""


def has_transformer(module: nn.Module) -> bool:
    """Whether ``module`` holds a transformers model (which does not run under ``vmap``)."""
    return any(type(m).__module__.startswith("transformers.") for m in module.modules())


def _rows(batch: Any) -> int:
    if isinstance(batch, dict):
        return len(next(iter(batch.values())))
    if isinstance(batch, (tuple, list)):
        return len(batch[0])
    return len(batch)


def _map(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, dict):
        return {k: fn(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(fn(v) for v in batch)
    return fn(batch)


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """min(1, C / (‖g_i‖ + 1e-6)) for each example's gradient norm."""
    return (clip / (norms + EPS)).clamp(max=1.0)


class PerExampleClip:
    """The clipped sum Σ_i clip_C(∇ℓ_i) of a batch, w.r.t. ``params`` of ``module``."""

    def __init__(
        self, module: nn.Module, params: Sequence[torch.nn.Parameter], task: Task, clip: float
    ) -> None:
        why = refusal(module)
        if why:
            raise ValueError(why)
        self.module, self.task, self.clip = module, task, clip
        self.params = list(params)
        index = {id(p): n for n, p in module.named_parameters()}
        self.names = [index[id(p)] for p in self.params]
        self.by_example = has_transformer(module)
        #: the linear chain's layers where the outer-product rule applies (all of it trained)
        self.chain = chain_of(module, self.params, task, convolutions=True)
        if not self.by_example:
            self._grads = vmap(
                grad_and_value(self._loss_one), in_dims=(None, None, 0), randomness="different"
            )
            # views of the tensors (the optimiser steps them in place), made once per call
            self._trained = {n: p.detach() for n, p in zip(self.names, self.params, strict=True)}
            self._frozen = {
                n: p.detach() for n, p in module.named_parameters() if n not in self._trained
            }
            self._frozen.update(module.named_buffers())

    def _loss_one(self, trained: dict, frozen: dict, example: Any) -> torch.Tensor:
        def forward(*args: Any, **kwargs: Any) -> Any:
            return functional_call(self.module, frozen | trained, args, kwargs)

        return self.task.loss(forward, _map(example, lambda t: t.unsqueeze(0)))

    def __call__(self, batch: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(the clipped sum of the examples' gradients, one per param; their losses)."""
        if self.chain is not None:
            params = dict(zip(self.names, self.params, strict=True))
            sums, losses = chain_clipped_sum(self.chain, params, batch, self.clip)
            if sums is not None:
                return [sums[n] for n in self.names], losses
            self.chain = None  # a layer saw more than one row per example: per-example grads
        grads, losses = self.per_example(batch)
        return clipped_sum(grads, self.clip), losses

    def per_example(self, batch: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each example's gradient (one tensor (B, ...) per param) and loss (B,)."""
        if self.by_example:
            return self._one_by_one(batch)
        grads, losses = self._grads(self._trained, self._frozen, batch)
        return [grads[n] for n in self.names], losses.detach()

    def _one_by_one(self, batch: Any) -> tuple[list[torch.Tensor], torch.Tensor]:
        grads: list[list[torch.Tensor]] = [[] for _ in self.params]
        losses = []
        for i in range(_rows(batch)):
            loss = self.task.loss(self.module, _map(batch, lambda t, i=i: t[i : i + 1]))
            got = torch.autograd.grad(loss, self.params, allow_unused=True)
            for out, p, g in zip(grads, self.params, got, strict=True):
                out.append(torch.zeros_like(p) if g is None else g)
            losses.append(loss.detach())
        return [torch.stack(g) for g in grads], torch.stack(losses)


def chain_of(
    module: nn.Module, params: Sequence[torch.Tensor], task: Task, convolutions: bool = False
) -> list[Layer] | None:
    """``module``'s linear chain where DP-SGD may take the outer-product rule: a plain
    classifier (cross-entropy per example) whose every parameter is trained; ``convolutions``:
    with ``Conv2d`` and pooling layers (one client's, not a batched group's)."""
    layers = linear_chain(module, convolutions)
    if layers is None or type(task) is not ClassificationTask:
        return None
    if {id(p) for p in module.parameters()} != {id(p) for p in params}:
        return None
    return layers


def chain_clipped_sum(
    layers: list[Layer],
    params: dict[str, torch.Tensor],
    batch: tuple[torch.Tensor, torch.Tensor],
    clip: float,
    stacked: bool = False,
) -> tuple[dict[str, torch.Tensor] | None, torch.Tensor]:
    """Σ_i clip_C(∇ℓ_i) of a linear chain by the outer-product rule, and the examples' losses;
    ``stacked``: k clients at once (params (k, ...), inputs (k, B, ...)). The sums are None
    where a linear layer sees more than one row per example (a sequence), where the rule's norm
    does not hold. ``params`` must be in the autograd graph (parameters, or stacked leaves).

    A linear layer's gradient δ_i a_iᵀ has norm ‖δ_i‖·‖a_i‖ and is never formed. A convolution's
    is δ_i (O, L) times its unfolded input (C·kh·kw, L) transposed, over the L output positions,
    formed per example ((B, O, C·kh·kw): B copies of its weight); its bias's, δ_i summed over L."""
    x, y = batch
    record: list = []
    logits = chain_forward(layers, params, x, stacked, record)
    losses = nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none").view(
        y.shape
    )
    rows = {"linear": 3 if stacked else 2, "conv": 4}  # a conv's input is (B, C, H, W)
    if any(a.ndim != rows[layer[0]] for layer, a, _ in record):
        return None, losses.detach()
    deltas = torch.autograd.grad(losses.sum(), [out for *_, out in record])
    square = torch.zeros_like(losses, dtype=torch.float32)
    own: dict[str, torch.Tensor] = {}  # the convolutions' per-example gradients, (B, ...)
    for (layer, a, _), d in zip(record, deltas, strict=True):
        kind, name, bias, *geometry = layer
        if kind == "linear":
            inputs = a.float().pow(2).sum(-1) + (1.0 if bias else 0.0)
            square = square + d.float().pow(2).sum(-1) * inputs
            continue
        stride, padding, dilation = geometry
        w = params[f"{name}.weight"]
        unfolded = nn.functional.unfold(a.detach(), w.shape[-2:], dilation, padding, stride)
        d = d.flatten(2)  # (B, O, L)
        own[f"{name}.weight"] = torch.bmm(d, unfolded.transpose(1, 2)).view(-1, *w.shape)
        if bias:
            own[f"{name}.bias"] = d.sum(2)
    for g in own.values():
        square = square + g.flatten(1).float().pow(2).sum(1)
    factor = clip_factors(square.sqrt(), clip)
    sums = {n: torch.tensordot(factor.to(g.dtype), g, dims=1) for n, g in own.items()}
    for (layer, a, _), d in zip(record, deltas, strict=True):
        kind, name, bias, *_ = layer
        if kind == "linear":
            scaled = d * factor.to(d.dtype).unsqueeze(-1)
            sums[f"{name}.weight"] = torch.einsum("...bo,...bi->...oi", scaled, a.detach())
            if bias:
                sums[f"{name}.bias"] = scaled.sum(-2)
    return sums, losses.detach()


def clipped_sum(
    per_example: Sequence[torch.Tensor], clip: float, axes: int = 1
) -> list[torch.Tensor]:
    """Σ_i clip_C(g_i) of per-example gradients, each tensor (B, ...), or (k, B, ...) for k
    clients (``axes`` 2); the norm of g_i is taken over all the tensors together."""
    lead = per_example[0].shape[:axes]
    norms = sum(g.reshape(*lead, -1).float().pow(2).sum(-1) for g in per_example)
    factor = clip_factors(norms.sqrt(), clip)
    return [
        (g * factor.to(g.dtype).view(*lead, *[1] * (g.ndim - axes))).sum(axes - 1)
        for g in per_example
    ]


def noised_mean(
    clipped: Sequence[torch.Tensor],
    rows: int,
    settings: DpSgdSettings,
    noise: torch.Generator,
) -> list[torch.Tensor]:
    """(Σ clip(g_i) + N(0, (z·C)²·I)) / rows, the noise drawn from ``noise`` tensor by tensor in
    the trained tensors' order (on the CPU, then moved: the same draws on any device)."""
    std = settings.noise_multiplier * settings.clip
    out = []
    for g in clipped:
        if std:
            z = torch.randn(g.shape, generator=noise, dtype=torch.float32).to(g.device, g.dtype)
            g = g + z * std
        out.append(g / rows)
    return out


class PrivateSteps:
    """A client's DP-SGD steps in ``train_local``: each sets the trained tensors' ``.grad`` to
    the noised mean of the clipped per-example gradients (plus the penalty's gradient); the
    caller's stepper then steps."""

    def __init__(
        self,
        module: nn.Module,
        params: Sequence[torch.nn.Parameter],
        task: Task,
        settings: DpSgdSettings,
        generator: torch.Generator,
    ) -> None:
        self.noise = noise_generator(generator)
        self.clipper = PerExampleClip(module, params, task, settings.clip)
        self.settings = settings
        self.params = list(params)

    def step(
        self,
        parts: Sequence[Any],
        stepper: Any,
        penalty: Callable[[Sequence[torch.Tensor]], torch.Tensor] | None = None,
    ) -> float:
        """One step's gradients from its micro-batches ``parts``; returns their mean loss."""
        total: list[torch.Tensor] | None = None
        losses = []
        for batch in parts:
            with stepper.forward_context():
                clipped, loss = self.clipper(batch)
            total = (
                clipped if total is None else [a + b for a, b in zip(total, clipped, strict=True)]
            )
            losses.append(loss)
        assert total is not None
        rows = sum(len(x) for x in losses)
        grads = noised_mean(total, rows, self.settings, self.noise)
        if penalty is not None:
            with stepper.forward_context():
                extra = torch.autograd.grad(
                    stepper.penalty(penalty, self.params), self.params, allow_unused=True
                )
            grads = [g if e is None else g + e for g, e in zip(grads, extra, strict=True)]
        for p, g in zip(self.params, grads, strict=True):
            p.grad = g.to(p.dtype)
        return float(torch.cat(losses).float().mean())
