"""The containers a run's data comes in: ``FederatedDataset`` (shared arrays, each client a
slice of them) and ``LabelledSet`` (a shared evaluation set)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from raysim.data.shifts import ClientShifts


@dataclass(frozen=True, eq=False)
class LabelledSet:
    """A labelled evaluation set of a classification dataset; ``client=None`` marks a shared one.

    Its metrics carry bare names (``accuracy``, ``loss``) when it is the ``test`` set.
    """

    x: np.ndarray
    y: np.ndarray
    client: int | None = None

    def __len__(self) -> int:
        return len(self.y)


@dataclass(eq=False)
class FederatedDataset:
    """Numpy arrays plus small metadata; one object-store copy serves every worker.

    Client ``j`` owns train rows ``client_indices[client_offsets[j]:client_offsets[j+1]]``.
    Dense inputs are float32 ``(N, *feature_shape)``; token inputs are int64
    ``(N, max_tokens)`` with 0 = padding and 1 = unknown.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    client_indices: np.ndarray
    client_offsets: np.ndarray
    num_classes: int
    input_kind: Literal["dense", "tokens"]
    vocab_size: int | None = None
    #: the server's in-distribution samples (carved from the test split), or None
    server_id: tuple[np.ndarray, np.ndarray] | None = None
    #: OOD pools by name: (x, y, num_classes)
    server_ood: dict[str, tuple[np.ndarray, np.ndarray, int]] | None = None
    #: further shared evaluation sets (e.g. a backdoor's triggered inputs), by name
    extra_eval: dict[str, LabelledSet] | None = None
    #: the padding id of token inputs (0 with raysim's vocabulary; a tokenizer's own otherwise)
    pad_id: int = 0
    #: per-client input shifts (``data.shift``): train rows are already in their owner's view,
    #: ``x_test`` is the reference view and ``shifts.test_view(j)`` client j's
    shifts: ClientShifts | None = None

    @property
    def num_clients(self) -> int:
        return len(self.client_offsets) - 1

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def eval_sets(self) -> dict[str, LabelledSet]:
        """What the workers evaluate on: the test split (minus any server split) and any extra
        sets, shared."""
        return {"test": LabelledSet(self.x_test, self.y_test), **(self.extra_eval or {})}

    def client_sizes(self) -> np.ndarray:
        """Number of train samples of every client, int64 ``(num_clients,)``."""
        return np.diff(self.client_offsets)

    def client_train_indices(self, j: int) -> np.ndarray:
        """Indices into ``x_train`` owned by client ``j``."""
        if not 0 <= j < self.num_clients:
            raise IndexError(f"client {j} out of range [0, {self.num_clients})")
        return self.client_indices[self.client_offsets[j] : self.client_offsets[j + 1]]

    def client_data(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of client ``j`` (a copy gathered from the shared arrays)."""
        idx = self.client_train_indices(j)
        return self.x_train[idx], self.y_train[idx]

    def label_histogram(self) -> np.ndarray:
        """Per-client label counts, int64 ``(num_clients, num_classes)``."""
        owner = np.repeat(np.arange(self.num_clients), self.client_sizes())
        labels = self.y_train[self.client_indices]
        hist = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        np.add.at(hist, (owner, labels), 1)
        return hist

    def summary(self) -> dict:
        """Sizes and label-skew statistics (JSON-friendly)."""
        sizes = self.client_sizes()
        hist = self.label_histogram()
        entropy = _normalized_entropy(hist)
        return {
            "name": self.name,
            "num_clients": self.num_clients,
            "num_train": int(len(self.y_train)),
            "num_test": int(len(self.y_test)),
            "num_classes": self.num_classes,
            "input_kind": self.input_kind,
            "feature_shape": list(self.feature_shape),
            "vocab_size": self.vocab_size,
            "client_size": _stats(sizes),
            "labels_per_client": _stats((hist > 0).sum(axis=1)),
            "label_entropy": _stats(entropy),
            "train_label_counts": np.bincount(self.y_train, minlength=self.num_classes).tolist(),
        }


def _stats(values: np.ndarray) -> dict[str, float]:
    values = np.asarray(values, dtype=np.float64)
    return {
        "min": float(values.min()),
        "max": float(values.max()),
        "mean": float(values.mean()),
        "std": float(values.std()),
    }


def _normalized_entropy(hist: np.ndarray) -> np.ndarray:
    """Per-row label entropy divided by log(num_classes): 0 = one label, 1 = uniform."""
    totals = np.maximum(hist.sum(axis=1, keepdims=True), 1)
    p = hist / totals
    with np.errstate(divide="ignore", invalid="ignore"):
        h = 0.0 - np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)  # 0.0 - x avoids -0.0
    return h / np.log(hist.shape[1]) if hist.shape[1] > 1 else np.zeros(len(hist))
