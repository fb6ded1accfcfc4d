"""The vision proxy's foundation of FedBaF spec §8.1: the 20-class flipped-digit task.

The foundation pool (``samples`` of its 600 images) is doubled by mirroring; the label is
``digit + 10·mirrored``. The model is the federated run's own architecture (default the MLP
64→128→128) with 20 outputs, so its body has the FL model's tensor names and shapes and only the
head differs: FedBaF's exact matcher mixes the body and leaves the head, as in Tiny-ImageNet-200 →
CIFAR-10. ``model.safetensors`` holds the global layout's tensors; ``raysim_foundation.json`` the
settings and the held-out 20-class accuracy on the mirrored test pool.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field

from raysim.data.digits_split import digits_pools, twenty_classes
from raysim.models.pretraining import Progress, save_foundation, train_supervised
from raysim.models.registry import DataSpec, ModelConfig, build_handle
from raysim.schema import StrictModel

CLASSES = 20


def _default_model() -> ModelConfig:
    return ModelConfig(name="mlp", hidden=[128, 128])


class DigitsPretrainConfig(StrictModel):
    """§8.1's foundation-quality knobs: pool samples (100 / 300 / 600) and epochs (2 / 20)."""

    samples: int = Field(600, ge=10, le=600, description="foundation-pool images used")
    epochs: int = Field(20, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    seed: int = 0
    split_seed: int = Field(0, description="the §8.1 split; FL runs must use the same")
    model: ModelConfig = Field(default_factory=_default_model)


def source_spec(meta: dict[str, Any] | None = None) -> DataSpec:
    return DataSpec("dense", (64,), CLASSES)


def source_eval_set(meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The 297 test images and their mirrors with 20-class labels (the foundation's own task)."""
    x, y = digits_pools(int(meta.get("split_seed", 0)))["test"]
    return twenty_classes(x, y)


def pretrain_digits(
    cfg: DigitsPretrainConfig, out_dir: str | Path, progress: Progress | None = None
) -> dict[str, Any]:
    """Train the 20-class foundation; write weights and metadata; return the metadata."""
    from raysim.training.loop import evaluate

    t0 = time.perf_counter()
    pool_x, pool_y = digits_pools(cfg.split_seed)["foundation"]
    rng = np.random.default_rng([cfg.seed, 20])
    keep = np.sort(rng.permutation(len(pool_y))[: cfg.samples])
    x, y = (torch.as_tensor(a) for a in twenty_classes(pool_x[keep], pool_y[keep]))
    torch.manual_seed(cfg.seed)
    handle = build_handle(cfg.model, source_spec())
    opt = torch.optim.SGD(handle.module.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    train_supervised(handle.module, x, y, opt, cfg.epochs, cfg.batch_size, cfg.seed, progress)
    split = {"split_seed": cfg.split_seed}
    scores = evaluate(handle.module, *(torch.as_tensor(a) for a in source_eval_set(split)))
    meta = {
        "task": "digits20",
        "samples": cfg.samples,
        "epochs": cfg.epochs,
        "lr": cfg.lr,
        "seed": cfg.seed,
        **split,
        "model": cfg.model.model_dump(mode="json"),
        "heldout_accuracy": scores["accuracy"],
        "heldout_loss": scores["loss"],
        "pretrain_seconds": time.perf_counter() - t0,
    }
    return save_foundation(handle, out_dir, meta)
