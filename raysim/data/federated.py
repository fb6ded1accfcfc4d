"""DataConfig and ``build_federated_dataset``: load, split, partition (the containers are in
``raysim.data.container``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from raysim.data.builtin import BUILTIN_LOADERS, RawData
from raysim.data.container import FederatedDataset
from raysim.data.digits_split import DigitsConfig, load_fedbaf_digits, load_fedot_digits
from raysim.data.hf import HFConfig, load_hf
from raysim.data.images import HFImageConfig, image_pool, load_hf_image
from raysim.data.markov import MarkovConfig, load_markov
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
from raysim.data.synthetic import SyntheticConfig
from raysim.data.text import build_vocab, encode
from raysim.data.text_lm import HFTextLMConfig, load_text_lm
from raysim.data.text_tasks import (
    TEXT_TASK_DATASETS,
    TextTaskConfig,
    TextTaskDataset,
    build_text_task_dataset,
)
from raysim.schema import StrictModel

SPLIT_TAG = 1  # rng = default_rng([seed, SPLIT_TAG]) for the train/test split
PARTITION_TAG = 2  # rng = default_rng([seed, PARTITION_TAG]) for the client partition


class DataConfig(StrictModel):
    """Which dataset to load and how to split it; ``hf`` options apply to ``name='hf'``,
    ``hf_image`` options to image sets (``name='hf_image'``, feddle.md §5.2), ``text`` options to
    the instruction-tuning sets ``flan_mini``/``flan`` (fedoa spec §4)."""

    name: Literal[
        "digits",
        "mnist1d",
        "bbc_news",
        "hf",
        "hf_image",
        "flan_mini",
        "flan",
        "markov",
        "hf_lm",
        "synthetic",
    ] = "digits"
    test_fraction: float = Field(0.2, gt=0, lt=1)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    vocab_size: int = Field(5000, ge=3)  # text: embedding rows incl. pad (0) and unk (1)
    max_tokens: int = Field(256, ge=1)  # text: tokens per sample after truncate/pad
    hf: HFConfig = Field(default_factory=HFConfig)
    hf_image: HFImageConfig = Field(default_factory=HFImageConfig)
    text: TextTaskConfig = Field(default_factory=TextTaskConfig)
    server: ServerDataConfig = Field(default_factory=ServerDataConfig)
    markov: MarkovConfig = Field(default_factory=MarkovConfig)
    digits: DigitsConfig = Field(default_factory=DigitsConfig)
    hf_lm: HFTextLMConfig = Field(default_factory=HFTextLMConfig)
    shift: ShiftConfig = Field(default_factory=ShiftConfig)
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    tokenizer: str | None = Field(
        None,
        description="text classification: token ids from this Hugging Face tokenizer (a "
        "directory, a hub id, or smollm2), what a pretrained model at model.path reads; None: "
        "raysim's word vocabulary",
    )

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        if self.shift.kind != "none":
            tokens = self.name in ("bbc_news", "markov", "hf_lm", *TEXT_TASK_DATASETS) or (
                self.name == "hf" and self.hf.text_column is not None
            )
            if self.name in (*TEXT_TASK_DATASETS, "markov", "hf_lm"):
                raise ValueError(f"data.shift does not apply to name={self.name!r}")
            if tokens != (self.shift.kind == "embedding"):
                raise ValueError(
                    "data.shift.kind embedding shifts token embeddings (text data); affine and "
                    f"colour shift dense inputs: name={self.name!r} does not take "
                    f"{self.shift.kind!r}"
                )
            if self.server != ServerDataConfig():
                raise ValueError("data.shift does not combine with data.server yet")
        if self.name in TEXT_TASK_DATASETS and self.server != ServerDataConfig():
            raise ValueError(
                f"data.server (server-side data) is not available for name={self.name!r} yet"
            )
        if self.name in TEXT_TASK_DATASETS:
            self.text.check(self.name)
            if self.partition != PartitionConfig():
                raise ValueError(
                    f"partition options do not apply to name={self.name!r}: clients follow "
                    "leave-one-task-out (use data.text.shards_per_task)"
                )
        elif self.text != TextTaskConfig():
            raise ValueError(
                f"text options only apply to name in {TEXT_TASK_DATASETS}, not name={self.name!r}"
            )
        if self.name == "hf":
            self.hf.check()
        elif self.hf != HFConfig():
            raise ValueError(f"hf options only apply to name='hf', not name={self.name!r}")
        if self.name == "hf_image":
            self.hf_image.check()
        elif self.hf_image != HFImageConfig():
            raise ValueError(
                f"hf_image options only apply to name='hf_image', not name={self.name!r}"
            )
        if self.name != "digits" and self.digits != DigitsConfig():
            raise ValueError(f"digits options only apply to name='digits', not name={self.name!r}")
        if self.name == "hf_lm":
            self.hf_lm.check()
        elif self.hf_lm != HFTextLMConfig():
            raise ValueError(f"hf_lm options only apply to name='hf_lm', not name={self.name!r}")
        if self.name == "synthetic":
            for key, default in (
                ("partition", PartitionConfig()),
                ("server", ServerDataConfig()),
                ("shift", ShiftConfig()),
            ):
                if getattr(self, key) != default:
                    raise ValueError(
                        f"data.{key} does not apply to name='synthetic': each client's data is "
                        "its own generator's (data.synthetic sets how they differ)"
                    )
        elif self.synthetic != SyntheticConfig():
            raise ValueError(
                f"synthetic options only apply to name='synthetic', not name={self.name!r}"
            )
        if self.name != "markov" and self.markov != MarkovConfig():
            raise ValueError(f"markov options only apply to name='markov', not name={self.name!r}")
        natural_ids = (self.name == "hf" and self.hf.client_column) or (
            self.name == "hf_image" and self.hf_image.client_column
        )
        if self.partition.kind == "natural" and not natural_ids:
            raise ValueError(
                "partition.kind='natural' needs per-sample client ids: name='hf' with "
                "hf.client_column, or name='hf_image' with hf_image.client_column or a LEAF "
                "preset"
            )
        return self


def _dataset_name(cfg: DataConfig) -> str:
    if cfg.name == "hf":
        return f"hf:{cfg.hf.path}"
    if cfg.name == "hf_image":
        image = cfg.hf_image
        return f"hf_image:{image.preset or image.path}"
    if cfg.name == "hf_lm":
        return f"hf_lm:{cfg.hf_lm.preset or cfg.hf_lm.path}"
    return cfg.name


def load_raw(cfg: DataConfig, seed: int = 0) -> RawData:
    """Load the configured dataset before splitting (``seed``: the run's, for data noise)."""
    if cfg.name == "digits" and cfg.digits.split == "fedbaf":
        return load_fedbaf_digits(cfg.digits, seed)
    if cfg.name == "digits" and cfg.digits.split == "fedot":
        return load_fedot_digits(cfg.digits, seed)
    if cfg.name == "hf":
        return load_hf(cfg.hf)
    if cfg.name == "hf_image":
        return load_hf_image(cfg.hf_image)
    if cfg.name == "markov":
        return load_markov(cfg.markov)
    if cfg.name == "hf_lm":
        return load_text_lm(cfg.hf_lm)
    return BUILTIN_LOADERS[cfg.name]()


def split_indices(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic sorted (train, test) row indices; the test set gets ~``test_fraction``."""
    if n < 2:
        raise ValueError(f"need at least 2 samples to split train/test, got {n}")
    n_test = min(max(1, round(n * test_fraction)), n - 1)
    perm = np.random.default_rng([seed, SPLIT_TAG]).permutation(n)
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _train_test(raw: RawData, cfg: DataConfig, seed: int) -> tuple[RawData, RawData]:
    """Split ``raw`` into train/test ``RawData`` (carving test only when the source has none)."""
    if raw.x_test is not None and raw.y_test is not None:
        train = replace(raw, x_test=None, y_test=None)
        return train, RawData(raw.x_test, raw.y_test, raw.num_classes, raw.is_text)
    tr, te = split_indices(len(raw.y), cfg.test_fraction, seed)

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


def build_federated_dataset(
    cfg: DataConfig, num_clients: int, seed: int
) -> FederatedDataset | TextTaskDataset:
    """Load, split train/test from ``seed``, tokenize text, partition train among clients.

    ``flan_mini``/``flan`` return a ``TextTaskDataset`` (leave-one-task-out; ``num_clients``
    must equal the number of clients the protocol yields).
    """
    if cfg.name in TEXT_TASK_DATASETS:
        return build_text_task_dataset(cfg.text, cfg.name, num_clients, seed, cfg.vocab_size)
    if cfg.name == "synthetic":
        from raysim.data.generated import build_synthetic

        return build_synthetic(cfg.synthetic, cfg.test_fraction, num_clients, seed)
    raw = load_raw(cfg, seed)
    train, test = _train_test(raw, cfg, seed)
    vocab_size, pad_id = None, 0
    if raw.is_text and cfg.tokenizer:
        x_train, x_test, vocab_size, pad_id = encode_with(
            cfg.tokenizer, train, test, cfg.max_tokens
        )
        kind = "tokens"
    elif raw.is_text:
        vocab = build_vocab(train.x, cfg.vocab_size)
        x_train, x_test = (encode(d.x, vocab, cfg.max_tokens) for d in (train, test))
        vocab_size, kind = len(vocab) + 2, "tokens"
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
    if cfg.shift.kind != "none":
        if (kind == "tokens") != (cfg.shift.kind == "embedding"):
            raise ValueError(f"data.shift {cfg.shift.kind!r} does not apply to {kind} inputs")
        shifts = ClientShifts(cfg.shift, seed, x_test)
        x_train = shift_clients(shifts, x_train, indices, offsets)
        x_test = shifts.reference(x_test)
    return FederatedDataset(
        name=_dataset_name(cfg),
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
