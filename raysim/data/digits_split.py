"""The digits split of FedBaF spec §8.1: a foundation pool, an FL pool and a test set, fixed.

sklearn's 1,797 digits are split once, stratified by digit, with ``split_seed`` (independent of a
run's seed, so the foundation never sees an FL or test image whatever the run): a foundation pool
of 600, an FL pool of 900 and a test set of the other 297.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from raysim.data.builtin import RawData
from raysim.schema import StrictModel

SPLIT_TAG = 0x813  # rng = default_rng([split_seed, SPLIT_TAG])
SIZES = {"foundation": 600, "federated": 900}  # the test set is the rest (297)


def digits_pools(split_seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"foundation", "federated", "test"}`` → (x float32 (N, 64) in [0, 1], y int64)."""
    from raysim.data.builtin import load_digits

    raw = load_digits()
    rng = np.random.default_rng([split_seed, SPLIT_TAG])
    n = len(raw.y)
    share = {name: size / n for name, size in SIZES.items()}
    pools: dict[str, list[np.ndarray]] = {"foundation": [], "federated": [], "test": []}
    # stratified: each class is cut in the same proportions, then the totals are fixed exactly
    order = np.concatenate([rng.permutation(np.flatnonzero(raw.y == c)) for c in range(10)])
    quota = {name: round(s * n) for name, s in share.items()}
    for c in range(10):
        rows = order[raw.y[order] == c]
        a = round(len(rows) * share["foundation"])
        b = round(len(rows) * share["federated"])
        pools["foundation"].append(rows[:a])
        pools["federated"].append(rows[a : a + b])
        pools["test"].append(rows[a + b :])
    out = {k: np.concatenate(v) for k, v in pools.items()}
    for name in SIZES:  # rounding per class: move the difference from / to the test set
        diff = quota[name] - len(out[name])
        if diff > 0:
            out[name] = np.concatenate([out[name], out["test"][:diff]])
            out["test"] = out["test"][diff:]
        elif diff < 0:
            out["test"] = np.concatenate([out["test"], out[name][diff:]])
            out[name] = out[name][:diff]
    return {k: (raw.x[np.sort(v)], raw.y[np.sort(v)]) for k, v in out.items()}


def flipped(x: np.ndarray) -> np.ndarray:
    """Each 8×8 image mirrored left to right (flat (N, 64) in, flat out)."""
    return x.reshape(-1, 8, 8)[:, :, ::-1].reshape(len(x), 64).copy()


def twenty_classes(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """§8.1's foundation task: the images and their mirrors, label = digit + 10·mirrored."""
    return np.concatenate([x, flipped(x)]), np.concatenate([y, y + 10]).astype(np.int64)


class DigitsConfig(StrictModel):
    """``data.digits`` (name: digits). ``split: fedbaf`` trains on §8.1's FL pool and tests on
    its 297 images; ``pixel_noise`` adds N(0, σ²) on the 0–16 pixel scale to the FL train images
    only (§8.1's optional widening of the gaps), drawn from the run seed. ``split: fedot`` is
    FedOT spec §9.1's: ``train_size`` shuffled images for the clients, the rest for testing."""

    split: Literal["random", "fedbaf", "fedot"] = Field(
        "random",
        description="random: all 1,797 images, data.test_fraction held out; fedbaf: FedBaF spec "
        "§8.1's fixed FL and test pools; fedot: FedOT spec §9.1's shuffled train_size",
    )
    split_seed: int = Field(0, description="fixes the fedbaf pools, whatever the run seed")
    train_size: int = Field(
        1500,
        ge=1,
        lt=1797,
        description="split fedot: the first train_size images after a shuffle with the run "
        "seed train the clients (n·m; partition.kind contiguous gives client i the i-th chunk), "
        "the rest are the test pool (FedOT spec §9.1)",
    )
    pixel_noise: float = Field(0.0, ge=0, description="σ on the 0–16 scale (train images only)")


NOISE_TAG = 0x815  # rng = default_rng([run seed, NOISE_TAG]) for the pixel noise


def load_fedbaf_digits(cfg: DigitsConfig, seed: int) -> RawData:
    """The FL pool as train and the test pool as the source's own test split (§8.1)."""
    pools = digits_pools(cfg.split_seed)
    x, y = pools["federated"]
    if cfg.pixel_noise:
        rng = np.random.default_rng([seed, NOISE_TAG])
        x = (x + rng.normal(0.0, cfg.pixel_noise / 16.0, x.shape)).astype(np.float32)
    xt, yt = pools["test"]
    return RawData(x=x, y=y, num_classes=10, x_test=xt, y_test=yt)


FEDOT_TAG = 0xF01  # rng = default_rng([run seed, FEDOT_TAG]) for FedOT spec §9.1's shuffle


def load_fedot_digits(cfg: DigitsConfig, seed: int) -> RawData:
    """FedOT spec §9.1: shuffle with the run seed; the first ``train_size`` images train, the rest
    test (with n·m = train_size and a contiguous partition, client i holds the i-th m)."""
    from raysim.data.builtin import load_digits

    raw = load_digits()
    order = np.random.default_rng([seed, FEDOT_TAG]).permutation(len(raw.y))
    tr, te = order[: cfg.train_size], order[cfg.train_size :]
    return RawData(x=raw.x[tr], y=raw.y[tr], num_classes=10, x_test=raw.x[te], y_test=raw.y[te])
