"""A ``Sequential`` of ``Linear``, ``Flatten`` and elementwise layers, read as a list of layers:
the models whose forward pass raysim writes out itself, for k clients at once (batched
training) or with each linear layer's input and output kept (DP-SGD's per-example norms)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: layers whose batched form is the layer itself (they act elementwise)
ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.Tanh, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Identity)

#: ("linear", name, has_bias) | ("flatten", start_dim) | ("apply", layer)
Layer = tuple


def linear_chain(template: nn.Module) -> list[Layer] | None:
    """``template``'s layers in order, or None where it is not such a ``Sequential``."""
    layers: list[Layer] = []

    def walk(module: nn.Module, prefix: str) -> bool:
        for name, child in module.named_children():
            if isinstance(child, nn.Sequential):
                if not walk(child, f"{prefix}{name}."):
                    return False
            elif isinstance(child, nn.Linear):
                layers.append(("linear", f"{prefix}{name}", child.bias is not None))
            elif isinstance(child, nn.Flatten) and child.start_dim >= 1 and child.end_dim == -1:
                layers.append(("flatten", child.start_dim))
            elif isinstance(child, ELEMENTWISE) or (isinstance(child, nn.Dropout) and not child.p):
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
    linear layer's (name, has_bias, input, output)."""
    for kind, *rest in layers:
        if kind == "linear":
            name, bias = rest
            w = params[f"{name}.weight"]
            b = params[f"{name}.bias"] if bias else None
            if not stacked:
                out = nn.functional.linear(x, w, b)
            elif b is not None:
                out = torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
            else:
                out = torch.bmm(x, w.transpose(1, 2))
            if record is not None:
                record.append((name, bias, x, out))
            x = out
        elif kind == "flatten":
            x = x.flatten(rest[0] + int(stacked))
        else:
            x = rest[0](x)
    return x
