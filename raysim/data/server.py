"""Server-side data (Feddle spec §7.1 item 6, §5.2, §8.1): an in-distribution split carved from the
test split, and out-of-distribution pools with their own label space."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from raysim.data.images import HFImageConfig
from raysim.schema import StrictModel

SERVER_ID_TAG = 3  # rng = default_rng([seed, SERVER_ID_TAG]) picks the server's ID samples
SERVER_OOD_TAG = 4


class OODPoolConfig(StrictModel):
    """An OOD pool (Feddle spec §8.1). ``shapes``: generated square images of a horizontal bar, a
    vertical bar, a diagonal or a box at a random place with additive uniform noise, 4 labels.
    ``label_disjoint``: the dataset's own images of ``labels``, relabelled 0..len-1; the clients,
    the ID server set and the evaluation then see only the other labels (digits: clients 0–4,
    the server's probe 5–9). ``hf_image``: ``size`` images drawn uniformly from an image dataset
    (§5.2: a 250K ImageNet subset, ``hf_image: {preset: imagenet}``), stored at the clients'
    image shape."""

    name: str = Field(
        "shapes", description="the pool's name, which a method's ood_pool parameter picks"
    )
    kind: Literal["shapes", "label_disjoint", "hf_image"] = Field(
        "shapes",
        description="shapes: generated bar, diagonal and box images (4 labels); label_disjoint: "
        "the dataset's own images of labels, kept from the clients; hf_image: images of another "
        "dataset (hf_image)",
    )
    size: int = Field(1000, ge=1, description="pool size (label_disjoint: at most this many)")
    noise: float = Field(0.2, ge=0, description="shapes: amplitude of the additive noise")
    labels: list[int] = Field(
        default_factory=lambda: [5, 6, 7, 8, 9], description="label_disjoint: the server's labels"
    )
    hf_image: HFImageConfig | None = Field(None, description="hf_image: the dataset to draw from")

    @model_validator(mode="after")
    def _check(self) -> OODPoolConfig:
        if (self.kind == "hf_image") != (self.hf_image is not None):
            raise ValueError("an OOD pool has hf_image options exactly when kind is hf_image")
        if self.hf_image is not None:
            self.hf_image.check()
        return self


class ServerDataConfig(StrictModel):
    """What the server holds besides the model. ``id_size`` samples (uniformly at random, Feddle
    spec A20) leave the test split for the server; evaluation uses the rest."""

    id_size: int = Field(0, ge=0, description="in-distribution server samples from the test split")
    ood: list[OODPoolConfig] = Field(
        default_factory=list,
        description="out-of-distribution pools the server holds (Feddle spec §8.1), e.g. "
        "[{kind: shapes}]",
    )


def carve_id_split(n_test: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (server, evaluation) row indices of the test split."""
    if size >= n_test:
        raise ValueError(
            f"data.server.id_size={size} leaves no evaluation data (the test split has {n_test})"
        )
    perm = np.random.default_rng([seed, SERVER_ID_TAG]).permutation(n_test)
    return np.sort(perm[:size]), np.sort(perm[size:])


def shapes_pool(cfg: OODPoolConfig, feature_shape: tuple[int, ...], seed: int) -> tuple:
    """``(x, y)``: ``cfg.size`` shape images in [0, 1], flattened like the clients' inputs."""
    n_features = math.prod(feature_shape)
    side = math.isqrt(n_features)
    if side * side != n_features:
        raise ValueError(f"OOD 'shapes' needs square image inputs, not features {feature_shape}")
    rng = np.random.default_rng([seed, SERVER_OOD_TAG])
    y = rng.integers(0, 4, size=cfg.size)
    img = np.zeros((cfg.size, side, side), dtype=np.float32)
    for i, label in enumerate(y):
        length = int(rng.integers(side // 2, side + 1))
        r, c = (int(v) for v in rng.integers(0, side - length + 1, size=2))
        if label == 0:  # horizontal bar
            img[i, int(rng.integers(0, side)), c : c + length] = 1
        elif label == 1:  # vertical bar
            img[i, r : r + length, int(rng.integers(0, side))] = 1
        elif label == 2:  # diagonal
            idx = np.arange(length)
            img[i, r + idx, c + idx] = 1
        else:  # box outline
            img[i, r, c : c + length] = img[i, r + length - 1, c : c + length] = 1
            img[i, r : r + length, c] = img[i, r : r + length, c + length - 1] = 1
    img += rng.uniform(0, cfg.noise, size=img.shape).astype(np.float32)
    x = np.clip(img, 0, 1).reshape(cfg.size, *feature_shape).astype(np.float32)
    return x, y.astype(np.int64)


def split_off_labels(
    x: np.ndarray, y: np.ndarray, labels: list[int]
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``((x, y) without ``labels``, (x, y) of ``labels`` relabelled 0..len-1)``."""
    held = np.isin(y, labels)
    remap = {label: i for i, label in enumerate(labels)}
    y_held = np.array([remap[int(v)] for v in y[held]], dtype=np.int64)
    return (x[~held], y[~held]), (x[held], y_held)


def subsample(x: np.ndarray, y: np.ndarray, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``size`` rows, picked uniformly (seeded), in their original order."""
    if len(y) <= size:
        return x, y
    pick = np.sort(np.random.default_rng([seed, SERVER_OOD_TAG]).permutation(len(y))[:size])
    return x[pick], y[pick]
