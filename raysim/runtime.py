"""Small helpers shared by the coordinator and workers (no Ray, no MLflow)."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from raysim.data import FederatedDataset
from raysim.models import DataSpec, ModelConfig, build_model
from raysim.models.params import get_flat

INIT_STREAM = 0x1417


def data_spec(dataset: FederatedDataset) -> DataSpec:
    return DataSpec(
        input_kind=dataset.input_kind,
        feature_shape=tuple(dataset.feature_shape),
        num_classes=dataset.num_classes,
        vocab_size=dataset.vocab_size,
    )


def initial_weights(cfg: ModelConfig, dataset: FederatedDataset, seed: int) -> np.ndarray:
    """Global model initialisation from the run seed's own stream."""
    init_seed = int(np.random.SeedSequence([seed, INIT_STREAM]).generate_state(1)[0])
    with torch.random.fork_rng():
        torch.manual_seed(init_seed)
        return get_flat(build_model(cfg, data_spec(dataset)))


def weights_digest(weights: np.ndarray) -> str:
    """sha256 of the float32 little-endian bytes of a weight vector."""
    return hashlib.sha256(np.ascontiguousarray(weights, dtype="<f4").tobytes()).hexdigest()


class GlobalEvaluator:
    """Evaluates a global weight vector on the run's test split (one resident model)."""

    def __init__(self, model_cfg: ModelConfig, dataset: FederatedDataset) -> None:
        from raysim.models.params import set_flat
        from raysim.training.loop import evaluate

        self._set_flat, self._evaluate = set_flat, evaluate
        self.model = build_model(model_cfg, data_spec(dataset))
        self.x = torch.tensor(np.asarray(dataset.x_test))
        self.y = torch.tensor(np.asarray(dataset.y_test), dtype=torch.long)

    def __call__(self, weights: np.ndarray) -> dict[str, float]:
        self._set_flat(self.model, weights)
        return self._evaluate(self.model, self.x, self.y)
