"""What the §8.1 foundations of FedBaF share: a seeded training loop and how a foundation is
saved (``model.safetensors`` under the global layout's names, ``raysim_foundation.json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.data.foundation_corpus import METADATA_FILE

Progress = Callable[[int, int, float], None]


def train_supervised(
    module: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    batch_size: int,
    seed: int,
    progress: Progress | None = None,
    max_grad_norm: float | None = None,
) -> None:
    """Cross-entropy training, batches shuffled from ``seed`` only; ``progress(step, total,
    loss)`` after every step."""
    gen = torch.Generator().manual_seed(seed)
    total = epochs * -(-len(y) // batch_size)
    step = 0
    module.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=gen).split(batch_size):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(x[idx]), y[idx])
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
            optimizer.step()
            step += 1
            if progress is not None:
                progress(step, total, float(loss.detach()))


def save_foundation(handle: Any, out_dir: str | Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Write the model's global tensors and ``meta`` (plus its parameter count) to ``out_dir``."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flat = handle.get_global()
    tensors = {k: np.ascontiguousarray(v) for k, v in handle.layout().unflatten(flat).items()}
    save_file(tensors, str(out / "model.safetensors"))
    meta = {**meta, "parameters": int(flat.size)}
    (out / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    return meta


def read_metadata(path: str | Path) -> dict[str, Any] | None:
    """A foundation's ``raysim_foundation.json`` (the directory, or a file inside it), or None."""
    p = Path(path)
    meta = (p if p.is_dir() else p.parent) / METADATA_FILE
    return json.loads(meta.read_text()) if meta.is_file() else None
