"""Hugging Face ``datasets`` loader: local csv/parquet/json files, saved datasets or hub ids."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from raysim.data.builtin import RawData
from raysim.schema import StrictModel


class HFSource(StrictModel):
    """Where a ``datasets`` dataset comes from and its label and client columns.

    ``path``/``name``/``data_files``/``data_dir`` go to ``datasets.load_dataset`` (or ``path`` to
    ``datasets.load_from_disk`` when ``load_from_disk``). ``test_split=None`` carves
    ``data.test_fraction`` out of the train split.
    """

    path: str | None = Field(
        None,
        description="datasets.load_dataset's path: a hub id, a builder (csv, parquet, json, "
        "imagefolder) or a folder; with load_from_disk, a save_to_disk folder",
    )
    name: str | None = Field(None, description="the dataset's configuration (load_dataset's name)")
    data_files: str | list[str] | dict[str, str | list[str]] | None = Field(
        None, description="files for a builder, e.g. {train: a.csv, test: b.csv}"
    )
    data_dir: str | None = Field(None, description="load_dataset's data_dir")
    load_from_disk: bool = Field(
        False, description="path is a folder written by save_to_disk (datasets.load_from_disk)"
    )
    cache_dir: str | None = Field(None, description="the datasets cache; None: datasets' own")
    train_split: str = Field("train", description="the split the clients train on")
    test_split: str | None = Field(
        None,
        description="the split evaluation uses; None: data.test_fraction of the train split",
    )
    label_column: str = Field(
        "label", description="the label column (integers, or strings numbered in sorted order)"
    )
    client_column: str | None = Field(
        None, description="natural client ids (partition.kind natural): one client per value"
    )


class HFConfig(HFSource):
    """Options for ``DataConfig(name="hf", hf=HFConfig(...))``: exactly one of
    ``feature_columns`` (numeric, -> float32 features) and ``text_column`` (-> token ids)."""

    feature_columns: list[str] | None = Field(
        None, description="numeric columns that make the float32 features (not with text_column)"
    )
    text_column: str | None = Field(
        None, description="a text column, tokenized into the inputs (not with feature_columns)"
    )

    def check(self) -> None:
        """Raise ValueError if the options cannot describe a usable dataset."""
        if not self.path:
            raise ValueError("data.name='hf' needs hf.path (e.g. 'csv', 'parquet' or a hub id)")
        if bool(self.feature_columns) == bool(self.text_column):
            raise ValueError(
                "data.name='hf' needs exactly one of hf.feature_columns (numeric features) "
                "or hf.text_column (text to tokenize)"
            )


def load_split(cfg: HFSource, split: str) -> Any:
    """One split of ``cfg``: ``datasets.load_from_disk`` when ``cfg.load_from_disk``, else
    ``datasets.load_dataset``."""
    import datasets

    if cfg.load_from_disk:
        obj = datasets.load_from_disk(cfg.path)
        if isinstance(obj, datasets.DatasetDict):
            if split not in obj:
                raise ValueError(f"split {split!r} not in {cfg.path!r}; found {list(obj)}")
            return obj[split]
        if split != cfg.train_split:
            raise ValueError(f"{cfg.path!r} is a single Dataset; it has no split {split!r}")
        return obj
    return datasets.load_dataset(
        cfg.path,
        cfg.name,
        data_files=cfg.data_files,
        data_dir=cfg.data_dir,
        split=split,
        cache_dir=cfg.cache_dir,
    )


def _columns(ds: Any, names: list[str]) -> dict[str, np.ndarray]:
    missing = [c for c in names if c not in ds.column_names]
    if missing:
        raise ValueError(f"column(s) {missing} not found; available: {ds.column_names}")
    return ds.with_format("numpy", columns=names)[:]


def _features(cols: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    arrays = [np.asarray(cols[c]) for c in names]
    for c, a in zip(names, arrays, strict=True):
        if a.dtype.kind not in "biuf":
            raise ValueError(f"feature column {c!r} is not numeric (dtype {a.dtype})")
    if len(arrays) == 1 and arrays[0].ndim > 1:
        return arrays[0].astype(np.float32)  # one array-valued column keeps its shape
    flat = [a.reshape(len(a), -1) for a in arrays]
    return np.concatenate(flat, axis=1).astype(np.float32)


def _texts(values: np.ndarray) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = ["" if v is None else str(v) for v in values]
    return out


def label_ids(
    train: np.ndarray, test: np.ndarray | None, column: str, feature: Any
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """Map labels to int64 ids; strings by sorted order. Returns (train, test, num_classes)."""
    both = train if test is None else np.concatenate([train, test])
    if both.dtype.kind in "OUS":
        classes = np.unique(both.astype(str))
        ids = np.searchsorted(classes, both.astype(str)).astype(np.int64)
        num_classes = len(classes)
    else:
        ids = both.astype(np.int64)
        if not np.array_equal(ids, both) or (len(ids) and ids.min() < 0):
            raise ValueError(f"label column {column!r} must hold non-negative integers or strings")
        num_classes = int(ids.max()) + 1 if len(ids) else 0
        num_classes = max(num_classes, int(getattr(feature, "num_classes", 0) or 0))
    return ids[: len(train)], (None if test is None else ids[len(train) :]), num_classes


def client_ids(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind in "OUS":
        return values.astype(str)
    return values.astype(np.int64)


def _x(cols: dict[str, np.ndarray], cfg: HFConfig) -> np.ndarray:
    if cfg.text_column:
        return _texts(cols[cfg.text_column])
    return _features(cols, list(cfg.feature_columns or []))


def load_hf(cfg: HFConfig) -> RawData:
    """Load the train (and optional test) split into a ``RawData``."""
    cfg.check()
    inputs = [cfg.text_column] if cfg.text_column else list(cfg.feature_columns or [])
    train_ds = load_split(cfg, cfg.train_split)
    extra = [cfg.client_column] if cfg.client_column else []
    train = _columns(train_ds, [*inputs, cfg.label_column, *extra])
    test = None
    if cfg.test_split is not None:
        test = _columns(load_split(cfg, cfg.test_split), [*inputs, cfg.label_column])
    feature = train_ds.features.get(cfg.label_column)
    y, y_test, num_classes = label_ids(
        train[cfg.label_column],
        None if test is None else test[cfg.label_column],
        cfg.label_column,
        feature,
    )
    return RawData(
        x=_x(train, cfg),
        y=y,
        num_classes=num_classes,
        is_text=bool(cfg.text_column),
        x_test=None if test is None else _x(test, cfg),
        y_test=y_test,
        client_ids=client_ids(train[cfg.client_column]) if cfg.client_column else None,
    )
