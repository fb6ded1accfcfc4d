"""A population whose clients' rows are made when a client is asked for, not held: the
``synthetic`` dataset (``raysim.data.synthetic``) at any size."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raysim.data.container import FederatedDataset
from raysim.data.synthetic import (
    SyntheticConfig,
    client_samples,
    client_sizes,
    held_out,
    test_set,
)


def build_synthetic(
    cfg: SyntheticConfig, test_fraction: float, num_clients: int, seed: int
) -> GeneratedDataset:
    """The population's dataset: per-client sizes and the shared test set now, every client's
    samples when asked for."""
    sizes = client_sizes(cfg, num_clients, seed)
    held = held_out(sizes, test_fraction)
    x_test, y_test, _ = test_set(cfg, seed, sizes, held)
    train = sizes - held
    offsets = np.zeros(num_clients + 1, dtype=np.int64)
    np.cumsum(train, out=offsets[1:])
    return GeneratedDataset(
        name=f"synthetic({cfg.alpha:g},{cfg.beta:g})" + (" iid" if cfg.iid else ""),
        x_train=np.zeros((0, cfg.features), dtype=np.float32),
        y_train=np.zeros(0, dtype=np.int64),
        x_test=x_test,
        y_test=y_test,
        client_indices=np.zeros(0, dtype=np.int64),
        client_offsets=offsets,
        num_classes=cfg.classes,
        input_kind="dense",
        synthetic=cfg,
        seed=seed,
        samples=sizes,
    )


@dataclass(eq=False)
class GeneratedDataset(FederatedDataset):
    """A ``FederatedDataset`` whose clients' rows are made when asked for (``client_data``):
    only the sizes (``client_offsets``, 8 bytes a client) and the shared test set are held, so
    a worker's copy does not grow with the population. ``x_train`` is empty."""

    synthetic: SyntheticConfig | None = None
    seed: int = 0
    #: every client's samples before its held-out rows
    samples: np.ndarray | None = None

    def client_train_indices(self, j: int) -> np.ndarray:
        raise TypeError(f"{self.name}: clients' rows are made on demand; use client_data(j)")

    def client_data(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``j``'s training rows, made from (seed, j)."""
        if not 0 <= j < self.num_clients:
            raise IndexError(f"client {j} out of range [0, {self.num_clients})")
        assert self.synthetic is not None and self.samples is not None
        x, y = client_samples(self.synthetic, self.seed, j, int(self.samples[j]))
        n = int(self.client_offsets[j + 1] - self.client_offsets[j])
        return x[:n], y[:n]

    def label_histogram(self) -> np.ndarray:
        """Per-client label counts; makes every client's rows (O(population))."""
        hist = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        for j in range(self.num_clients):
            hist[j] = np.bincount(self.client_data(j)[1], minlength=self.num_classes)
        return hist

    def summary(self) -> dict:
        """Sizes and the test set's label counts; label skew needs ``label_histogram``."""
        return {
            "name": self.name,
            "num_clients": self.num_clients,
            "num_train": int(self.client_offsets[-1]),
            "num_test": int(len(self.y_test)),
            "num_classes": self.num_classes,
            "input_kind": self.input_kind,
            "feature_shape": list(self.feature_shape),
            "test_label_counts": np.bincount(self.y_test, minlength=self.num_classes).tolist(),
        }
