"""Flat float32 views of a model's trainable parameters: the unit that crosses the wire."""

from __future__ import annotations

import numpy as np
import torch


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def get_flat(model: torch.nn.Module) -> np.ndarray:
    """Concatenate trainable parameters (in ``model.parameters()`` order) into float32 numpy."""
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for p in trainable(model)]).float().numpy().copy()


def set_flat(model: torch.nn.Module, flat: np.ndarray) -> None:
    """Copy a flat vector back into the trainable parameters, in place."""
    params = trainable(model)
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


def named_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}


def unflatten(model: torch.nn.Module, flat: np.ndarray) -> dict[str, np.ndarray]:
    """Name → array views of a flat vector (for safetensors export)."""
    out, offset = {}, 0
    for name, shape in named_shapes(model).items():
        n = int(np.prod(shape))
        out[name] = flat[offset : offset + n].reshape(shape)
        offset += n
    return out
