"""Small helpers shared by the coordinator and workers (no Ray, no MLflow)."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from raysim.data import FederatedDataset
from raysim.models import DataSpec, ModelConfig, ModelHandle, build_handle

INIT_STREAM = 0x1417


def data_spec(dataset: FederatedDataset) -> DataSpec:
    return DataSpec(
        input_kind=dataset.input_kind,
        feature_shape=tuple(dataset.feature_shape),
        num_classes=dataset.num_classes,
        vocab_size=dataset.vocab_size,
    )


def init_seed(seed: int) -> int:
    """The seed under which every process builds the resident model (same init everywhere)."""
    return int(np.random.SeedSequence([seed, INIT_STREAM]).generate_state(1)[0])


def build_resident(
    cfg: ModelConfig, spec: DataSpec, seed: int, adapters: tuple[str, ...] = ("global",)
) -> ModelHandle:
    """Build the model under the run's init stream, so every process holds the same weights."""
    with torch.random.fork_rng():
        torch.manual_seed(init_seed(seed))
        return build_handle(cfg, spec, adapters)


def initial_weights(cfg: ModelConfig, dataset: FederatedDataset, seed: int) -> np.ndarray:
    """Initial global vector (from the run seed's init stream)."""
    return build_resident(cfg, data_spec(dataset), seed).get_global()


def weights_digest(weights: np.ndarray) -> str:
    """sha256 of the float32 little-endian bytes of a weight vector."""
    return hashlib.sha256(np.ascontiguousarray(weights, dtype="<f4").tobytes()).hexdigest()


class GlobalEvaluator:
    """Evaluates a global weight vector on the run's test split (one resident model)."""

    def __init__(self, model_cfg: ModelConfig, dataset: FederatedDataset) -> None:
        from raysim.training.loop import evaluate

        self._evaluate = evaluate
        self.handle = build_handle(model_cfg, data_spec(dataset))
        self.x = torch.tensor(np.asarray(dataset.x_test))
        self.y = torch.tensor(np.asarray(dataset.y_test), dtype=torch.long)

    def __call__(
        self, weights: np.ndarray, states: dict | None = None, final: bool = False
    ) -> dict[str, float]:
        self.handle.set_global(weights)
        return self._evaluate(self.handle.module, self.x, self.y)
