"""A ``Sequential`` of ``Linear``, ``Flatten`` and elementwise layers, read as a list of layers:
the models whose forward pass raysim writes out itself, for k clients at once (batched
training) or with each linear layer's input and output kept (DP-SGD's per-example norms).

DP-SGD on one client (``raysim.training.dp_sgd``) also reads ``convolutions``: a ``Conv2d``
(``groups`` 1, zero padding) and the pools, which act on each example alone, so a small CNN's
per-example gradients come from its layers' inputs and outputs too. Batched training does not
(its inputs carry the clients' axis in front, which ``conv2d`` and the pools do not take)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: layers whose batched form is the layer itself (they act elementwise)
ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Identity)
#: parameter-free layers that act on each example (N, C, H, W) alone: a convolutional chain's
POOLS = (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)

#: ("linear", name, has_bias) | ("conv", name, has_bias, stride, padding, dilation)
#: | ("flatten", start_dim) | ("apply", layer)
Layer = tuple


def _conv(child: nn.Module, name: str) -> Layer | None:
    """``child`` as a chain's ("conv", ...) layer, or None where the unfold rule does not hold."""
    if not isinstance(child, nn.Conv2d) or child.groups != 1 or child.padding_mode != "zeros":
        return None
    padding = child.padding
    if isinstance(padding, str):  # "valid", or "same" (stride 1) where it pads both sides alike
        reach = [d * (k - 1) for d, k in zip(child.dilation, child.kernel_size, strict=True)]
        if padding == "same" and any(r % 2 for r in reach):
            return None
        padding = tuple(r // 2 for r in reach) if padding == "same" else (0, 0)
    return ("conv", name, child.bias is not None, child.stride, padding, child.dilation)


def linear_chain(template: nn.Module, convolutions: bool = False) -> list[Layer] | None:
    """``template``'s layers in order, or None where it is not such a ``Sequential``;
    ``convolutions``: ``Conv2d`` and pooling layers too (one client's chain, never stacked)."""
    layers: list[Layer] = []

    def walk(module: nn.Module, prefix: str) -> bool:
        for name, child in module.named_children():
            if isinstance(child, nn.Sequential):
                if not walk(child, f"{prefix}{name}."):
                    return False
            elif isinstance(child, nn.Linear):
                layers.append(("linear", f"{prefix}{name}", child.bias is not None))
            elif convolutions and (conv := _conv(child, f"{prefix}{name}")) is not None:
                layers.append(conv)
            elif isinstance(child, nn.Flatten) and child.start_dim >= 1 and child.end_dim == -1:
                layers.append(("flatten", child.start_dim))
            elif isinstance(child, ELEMENTWISE) or (isinstance(child, nn.Dropout) and not child.p):
                layers.append(("apply", child))
            elif (
                convolutions
                and isinstance(child, POOLS)
                and not getattr(child, "return_indices", False)
            ):
                layers.append(("apply", child))
            else:
                return False
        return True

    if type(template) is not nn.Sequential or not walk(template, ""):
        return None
    return layers


def chain_forward(
    layers: list[Layer],
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    stacked: bool = False,
    record: list[Any] | None = None,
) -> torch.Tensor:
    """The chain's output for ``x``. ``stacked``: ``params`` are stacks (k, ...) and ``x`` is
    (k, B, ...), one batched matmul per layer for the k clients. ``record`` collects each
    linear or convolutional layer's (layer, input, output)."""
    for layer in layers:
        kind, *rest = layer
        if kind in ("linear", "conv"):
            name, bias = rest[:2]
            w = params[f"{name}.weight"]
            b = params[f"{name}.bias"] if bias else None
            if kind == "conv":
                assert not stacked, "a stacked chain has no convolutions"
                out = nn.functional.conv2d(x, w, b, *rest[2:])
            elif not stacked:
                out = nn.functional.linear(x, w, b)
            elif b is not None:
                out = torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
            else:
                out = torch.bmm(x, w.transpose(1, 2))
            if record is not None:
                record.append((layer, x, out))
            x = out
        elif kind == "flatten":
            x = x.flatten(rest[0] + int(stacked))
        else:
            x = rest[0](x)
    return x


#: elementwise layers whose derivative ``stacked_backward`` writes out
WRITTEN_OUT = (nn.ReLU, nn.Identity, nn.Dropout)


def written_out(layers: list[Layer] | None) -> bool:
    """Whether ``stacked_backward`` takes this stacked chain: linear layers, ``Flatten``,
    ``ReLU`` and identities (a ``Dropout`` here has p = 0)."""
    return layers is not None and all(
        kind != "apply" or isinstance(rest[0], WRITTEN_OUT) for kind, *rest in layers
    )


def stacked_backward(
    layers: list[Layer], params: dict[str, torch.Tensor], x: torch.Tensor, delta: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A stacked chain's (``written_out``) forward and backward without autograd: ``delta``
    maps the output (k, B, out) to (anything, ∂loss/∂output); returns that anything and each
    linear layer's gradients, (k, ...) like ``params``. Batched training of a small model
    spends most of a step in autograd's bookkeeping; this is a few batched matmuls."""
    inputs = []
    with torch.no_grad():
        for layer in layers:
            inputs.append(x)
            x = chain_forward([layer], params, x, stacked=True)
        value, grad = delta(x)
        grads: dict[str, torch.Tensor] = {}
        first = next(i for i, layer in enumerate(layers) if layer[0] == "linear")
        for i in range(len(layers) - 1, first - 1, -1):
            kind, *rest = layers[i]
            inp = inputs[i]
            if kind == "linear":
                name, bias = rest[:2]
                grads[f"{name}.weight"] = torch.bmm(grad.transpose(1, 2), inp)
                if bias:
                    grads[f"{name}.bias"] = grad.sum(1)
                if i > first:
                    grad = torch.bmm(grad, params[f"{name}.weight"])
            elif kind == "flatten":
                grad = grad.reshape(inp.shape)
            elif isinstance(rest[0], nn.ReLU):
                grad = grad * (inp > 0)
    return value, grads
