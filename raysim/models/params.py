"""Flat float32 views of parameter lists: the unit that crosses the wire."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def flatten(params: Sequence[torch.Tensor]) -> np.ndarray:
    """Concatenate tensors (in the given order) into one float32 numpy vector."""
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).float().cpu() for p in params]).numpy().copy()


def assign(params: Sequence[torch.Tensor], flat: np.ndarray) -> None:
    """Copy a flat vector into ``params`` in place (dtype and device of each tensor kept)."""
    expected = sum(p.numel() for p in params)
    if flat.shape != (expected,):
        raise ValueError(f"weight vector has shape {flat.shape}, the model expects ({expected},)")
    src = torch.from_numpy(np.array(flat, dtype=np.float32))  # a writable copy
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(src[offset : offset + n].view_as(p))
            offset += n


def get_flat(model: torch.nn.Module) -> np.ndarray:
    """A module's trainable parameters (``model.parameters()`` order) as one float32 vector."""
    return flatten(trainable(model))


def set_flat(model: torch.nn.Module, flat: np.ndarray) -> None:
    assign(trainable(model), flat)


def unflatten(shapes: Sequence[tuple[str, tuple[int, ...]]], flat: np.ndarray) -> dict:
    """Name → array views of a flat vector (for safetensors export)."""
    out, offset = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        out[name] = flat[offset : offset + n].reshape(shape)
        offset += n
    return out
