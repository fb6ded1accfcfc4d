"""The pipeline of every source whose rows are pooled, then split: load, split train/test, tokenize,
carve the server's data, partition among clients, shift their inputs. A source's config
(``raysim.data.federated``) says what it loads and how its text is encoded."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import numpy as np

from raysim.data.builtin import RawData
from raysim.data.container import FederatedDataset
from raysim.data.images import image_pool
from raysim.data.partition import PartitionConfig, pack, partition
from raysim.data.server import (
    SERVER_OOD_TAG,
    ServerDataConfig,
    carve_id_split,
    shapes_pool,
    split_off_labels,
    subsample,
)
from raysim.data.shifts import ClientShifts, ShiftConfig, shift_clients

SPLIT_TAG = 1  # rng = default_rng([seed, SPLIT_TAG]) for the train/test split
PARTITION_TAG = 2  # rng = default_rng([seed, PARTITION_TAG]) for the client partition


class PooledSource(Protocol):
    """What ``build_pooled`` reads of a source's config."""

    test_fraction: float
    partition: PartitionConfig
    server: ServerDataConfig

    def load(self, seed: int) -> RawData:
        """The rows before the split (``seed``: the run's, for data noise)."""
        ...

    def dataset_name(self) -> str: ...

    def input_shift(self) -> ShiftConfig: ...

    def encode_text(self, train: RawData, test: RawData) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(train ids, test ids, vocabulary size, pad id) of text rows."""
        ...


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic sorted (train, test) row indices; the test set gets ~``test_fraction``."""
    if n < 2:
        raise ValueError(f"need at least 2 samples to split train/test, got {n}")
    n_test = min(max(1, round(n * test_fraction)), n - 1)
    perm = np.random.default_rng([seed, SPLIT_TAG]).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _train_test(raw: RawData, test_fraction: float, seed: int) -> tuple[RawData, RawData]:
    """Split ``raw`` into train/test ``RawData`` (carving test only when the source has none)."""
    if raw.x_test is not None and raw.y_test is not None:
        train = replace(raw, x_test=None, y_test=None)
        return train, RawData(raw.x_test, raw.y_test, raw.num_classes, raw.is_text)
    tr, te = split_indices(len(raw.y), test_fraction, seed)

    def rows(a: np.ndarray | None) -> np.ndarray | None:  # the per-train-row fields
        return None if a is None else a[tr]

    train = replace(
        raw,
        x=raw.x[tr],
        y=raw.y[tr],
        client_ids=rows(raw.client_ids),
        partition_labels=rows(raw.partition_labels),
    )
    return train, RawData(raw.x[te], raw.y[te], raw.num_classes, raw.is_text)


def _check_labels(y: np.ndarray, num_classes: int, what: str) -> np.ndarray:
    y = np.ascontiguousarray(y, dtype=np.int64)
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"{what} labels must lie in [0, {num_classes}), got {y.min()}..{y.max()}")
    return y


def build_pooled(cfg: PooledSource, num_clients: int, seed: int) -> FederatedDataset:
    """Load ``cfg``'s rows, split train/test from ``seed``, tokenize text, carve the server's
    data, partition train among clients, shift their inputs."""
    raw = cfg.load(seed)
    train, test = _train_test(raw, cfg.test_fraction, seed)
    vocab_size, pad_id = None, 0
    if raw.is_text:
        x_train, x_test, vocab_size, pad_id = cfg.encode_text(train, test)
        kind = "tokens"
    elif raw.token_vocab is not None:  # already token ids (sequences; targets per position)
        x_train, x_test = (np.ascontiguousarray(d.x, dtype=np.int64) for d in (train, test))
        vocab_size, kind = raw.token_vocab, "tokens"
    else:
        x_train, x_test = (np.ascontiguousarray(d.x, dtype=np.float32) for d in (train, test))
        kind = "dense"
    y_train = _check_labels(train.y, raw.num_classes, "train")
    y_test = _check_labels(test.y, raw.num_classes, "test")
    ood = {}
    split_labels = train.partition_labels
    for pool in cfg.server.ood:
        if pool.kind == "label_disjoint":  # the server's labels leave the clients and the test
            if split_labels is not None:
                raise ValueError("a label_disjoint OOD pool cannot combine with partition labels")
            (x_train, y_train), (x_held, y_held) = split_off_labels(x_train, y_train, pool.labels)
            (x_test, y_test), _ = split_off_labels(x_test, y_test, pool.labels)
            x, y = subsample(x_held, y_held, pool.size, seed)
            ood[pool.name] = (x, y, len(pool.labels))
    server_id = None
    if cfg.server.id_size:
        srv, rest = carve_id_split(len(y_test), cfg.server.id_size, seed)
        server_id = (x_test[srv], y_test[srv])
        x_test, y_test = x_test[rest], y_test[rest]
    for pool in cfg.server.ood:
        if pool.kind == "shapes":
            x, y = shapes_pool(pool, tuple(x_train.shape[1:]), seed)
            ood[pool.name] = (x, y, 4)
        elif pool.kind == "hf_image" and pool.hf_image is not None:
            rng = np.random.default_rng([seed, SERVER_OOD_TAG, len(ood)])
            ood[pool.name] = image_pool(pool.hf_image, pool.size, tuple(x_train.shape[1:]), rng)
    rng = np.random.default_rng([seed, PARTITION_TAG])
    labels = y_train if split_labels is None else split_labels
    parts = partition(cfg.partition, labels, num_clients, rng, ids=train.client_ids)
    indices, offsets = pack(parts)
    shifts = None
    shift = cfg.input_shift()
    if shift.kind != "none":
        if (kind == "tokens") != (shift.kind == "embedding"):
            raise ValueError(f"data.shift {shift.kind!r} does not apply to {kind} inputs")
        shifts = ClientShifts(shift, seed, x_test)
        x_train = shift_clients(shifts, x_train, indices, offsets)
        x_test = shifts.reference(x_test)
    return FederatedDataset(
        name=cfg.dataset_name(),
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        client_indices=indices,
        client_offsets=offsets,
        num_classes=raw.num_classes,
        input_kind=kind,
        vocab_size=vocab_size,
        server_id=server_id,
        server_ood=ood or None,
        shifts=shifts,
        pad_id=pad_id,
    )


def encode_with(
    name: str, train: RawData, test: RawData, max_tokens: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(train ids, test ids, vocabulary size, pad id) from a Hugging Face tokenizer: truncated
    and right-padded to ``max_tokens``, no special tokens added."""
    from raysim.data.lm_encoding import pad_id_of
    from raysim.data.tokenizer import load_tokenizer

    tok = load_tokenizer(name)
    pad = pad_id_of(tok)

    def ids(texts: np.ndarray) -> np.ndarray:
        out = np.full((len(texts), max_tokens), pad, dtype=np.int64)
        for i, t in enumerate(texts):
            row = tok(t or "", add_special_tokens=False)["input_ids"][:max_tokens]
            out[i, : len(row)] = row
        return out

    return ids(train.x), ids(test.x), len(tok), pad
