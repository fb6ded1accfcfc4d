"""Image classification sets through Hugging Face ``datasets`` (Feddle spec §5.2, §8.2).

``data.name: hf_image`` reads any image dataset ``datasets`` can load (a hub id in the local
cache, a directory saved with ``save_to_disk``, or an ``imagefolder``), decodes it with Pillow
and stores float32 ``(N, C, H, W)`` in [0, 1], at ``size`` when given. Presets name the paper's
sets by their hub ids and columns; every field can still be overridden (for example ``path`` to a
local copy on a machine with no internet):

- ``mnist``: ``ylecun/mnist``, one channel (FedOT's MNIST and, with ``data.shift.kind: colour``,
  its Colored-MNIST, FedOT spec §6.2);
- ``cifar10``: ``uoft-cs/cifar10``;
- ``cifar100_superclass``: ``uoft-cs/cifar100``, trained on the 20 superclasses
  (``coarse_label``) and partitioned over the 100 fine classes (``fine_label``), §5.2;
- ``fashion_mnist``: ``zalando-datasets/fashion_mnist``, grayscale replicated to 3 channels (§5.1);
- ``femnist``: ``flwrlabs/femnist`` (LEAF), one client per writer, the first 40 classes only;
- ``celeba``: ``flwrlabs/celeba`` (LEAF), one client per celebrity, the binary "Smiling" task;
- ``imagenet``: ``ILSVRC/imagenet-1k`` with its 1000 labels, for the OOD pool of §5.2
  (``data.server.ood: [{kind: hf_image, hf_image: {preset: imagenet}, size: 250000}]``).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from raysim.data.builtin import RawData
from raysim.data.hf import HFSource, client_ids, label_ids, load_split

Preset = Literal[
    "mnist",
    "cifar10",
    "cifar100_superclass",
    "fashion_mnist",
    "femnist",
    "celeba",
    "imagenet",
    "tiny_imagenet",
]

CHUNK = 512  # images decoded at a time

#: the preset's field values (a field the config sets wins)
PRESETS: dict[str, dict[str, Any]] = {
    "mnist": {"path": "ylecun/mnist", "channels": 1},
    "cifar10": {"path": "uoft-cs/cifar10", "image_column": "img", "channels": 3},
    "cifar100_superclass": {
        "path": "uoft-cs/cifar100",
        "image_column": "img",
        "label_column": "coarse_label",
        "partition_label_column": "fine_label",
        "channels": 3,
    },
    "fashion_mnist": {"path": "zalando-datasets/fashion_mnist", "channels": 3},
    "femnist": {
        "path": "flwrlabs/femnist",
        "label_column": "character",
        "client_column": "writer_id",
        "keep_labels": 40,
        "test_split": None,
        "channels": 3,
    },
    "celeba": {
        "path": "flwrlabs/celeba",
        "label_column": "Smiling",
        "client_column": "celeb_id",
        "test_split": "test",
        "channels": 3,
    },
    "imagenet": {"path": "ILSVRC/imagenet-1k", "test_split": None, "channels": 3},
    # FedBaF's foundation data (FedBaF spec §4.1): 200 classes of 64×64 images, "valid" as test
    "tiny_imagenet": {"path": "zh-plus/tiny-imagenet", "test_split": "valid", "channels": 3},
}


class HFImageConfig(HFSource):
    """Options for ``DataConfig(name="hf_image", hf_image=HFImageConfig(...))`` and for an
    ``hf_image`` OOD pool; a ``preset`` fills the fields the config leaves unset."""

    preset: Preset | None = Field(
        None,
        description="a named set whose path and columns it fills (a key the config sets wins); "
        "None: give path",
    )
    test_split: str | None = Field(
        "test",
        description="the split evaluation uses; None: data.test_fraction of the train split",
    )
    image_column: str = Field("image", description="the column of the images")
    partition_label_column: str | None = Field(
        None, description="partition over this column instead of the label (CIFAR-100 fine)"
    )
    keep_labels: int | None = Field(None, ge=1, description="keep only labels below this")
    size: int | None = Field(None, ge=1, description="resize images to size×size")
    train_size: int | None = Field(
        None, ge=1, description="keep the first train_size train images (FedOT spec §6.1: n·m)"
    )
    channels: Literal[1, 3] | None = Field(None, description="1 = grayscale, 3 = RGB; None keeps")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        """The preset's values fill the fields the config does not give (so a dumped and
        reloaded config, which gives them all, stays the same)."""
        if isinstance(data, dict) and data.get("preset") is not None:
            return {**PRESETS[data["preset"]], **data}
        return data

    def check(self) -> None:
        if not self.path:
            raise ValueError(
                "data.name='hf_image' needs hf_image.preset or hf_image.path "
                "(a hub id, a save_to_disk directory, or 'imagefolder' with data_dir)"
            )


def to_array(images: list[Any], channels: int | None, size: int | None) -> np.ndarray:
    """Pillow images → float32 ``(N, C, H, W)`` in [0, 1], converted and resized alike."""
    from PIL import Image

    out = []
    for img in images:
        if channels is not None:
            img = img.convert("L" if channels == 1 else "RGB")
        if size is not None and img.size != (size, size):
            img = img.resize((size, size), Image.Resampling.BILINEAR)
        a = np.asarray(img, dtype=np.float32) / 255.0
        out.append(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))
    shapes = {a.shape for a in out}
    if len(shapes) > 1:
        raise ValueError(f"images of different shapes {sorted(shapes)[:3]}; set hf_image.size")
    return np.stack(out) if out else np.zeros((0, channels or 3, size or 1, size or 1), np.float32)


def images(ds: Any, cfg: HFImageConfig, rows: np.ndarray | None = None) -> np.ndarray:
    """The image column of ``ds`` (of ``rows`` only, when given) as float32 ``(N, C, H, W)``,
    decoded a chunk at a time so that only the stored arrays are ever whole in memory."""
    if cfg.image_column not in ds.column_names:
        found = ds.column_names
        raise ValueError(f"image column {cfg.image_column!r} not found; available: {found}")
    if rows is not None:
        ds = ds.select(rows.tolist())
    ds = ds.select_columns([cfg.image_column])
    out: np.ndarray | None = None
    for start in range(0, len(ds), CHUNK):
        chunk = to_array(ds[start : start + CHUNK][cfg.image_column], cfg.channels, cfg.size)
        if out is None:
            out = np.empty((len(ds), *chunk.shape[1:]), dtype=np.float32)
        if chunk.shape[1:] != out.shape[1:]:
            raise ValueError(f"images of shapes {out.shape[1:]} and {chunk.shape[1:]}; set size")
        out[start : start + len(chunk)] = chunk
    return out if out is not None else to_array([], cfg.channels, cfg.size)


def column(ds: Any, name: str) -> np.ndarray:
    """A label or id column as an array (bools as 0/1)."""
    if name not in ds.column_names:
        raise ValueError(f"column {name!r} not found; available: {ds.column_names}")
    a = np.asarray(ds.select_columns([name])[name])
    return a.astype(np.int64) if a.dtype == bool else a


def _classes(ds: Any, name: str) -> int:
    return int(getattr(ds.features.get(name), "num_classes", 0) or 0)


def _kept(y: np.ndarray, keep_labels: int | None) -> np.ndarray | None:
    """Rows whose label is below ``keep_labels`` (FEMNIST's first 40 classes, §5.2)."""
    return None if keep_labels is None else np.flatnonzero(y.astype(np.int64) < keep_labels)


def load_hf_image(cfg: HFImageConfig) -> RawData:
    """Load the train (and test) split of an image dataset into a ``RawData``."""
    cfg.check()
    train = load_split(cfg, cfg.train_split)
    if cfg.train_size is not None:
        if cfg.train_size > len(train):
            raise ValueError(
                f"hf_image.train_size {cfg.train_size} exceeds the {len(train)} train images"
            )
        train = train.select(range(cfg.train_size))
    y = column(train, cfg.label_column)
    rows = _kept(y, cfg.keep_labels)
    pick = slice(None) if rows is None else rows
    test, y_test, test_rows = None, None, None
    if cfg.test_split is not None:
        test = load_split(cfg, cfg.test_split)
        y_test = column(test, cfg.label_column)
        test_rows = _kept(y_test, cfg.keep_labels)
        y_test = y_test if test_rows is None else y_test[test_rows]
    y, y_test, num_classes = label_ids(y[pick], y_test, cfg.label_column, None)
    num_classes = cfg.keep_labels or max(num_classes, _classes(train, cfg.label_column))
    part = None
    if cfg.partition_label_column:
        raw_part = column(train, cfg.partition_label_column)[pick]
        part = label_ids(raw_part, None, cfg.partition_label_column, None)[0]
    ids = None
    if cfg.client_column:
        ids = client_ids(column(train, cfg.client_column)[pick])
    return RawData(
        x=images(train, cfg, rows),
        y=y,
        num_classes=num_classes,
        x_test=None if test is None else images(test, cfg, test_rows),
        y_test=y_test,
        client_ids=ids,
        partition_labels=part,
    )


def image_pool(
    cfg: HFImageConfig, size: int, shape: tuple[int, ...], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(x, y, num_classes)``: ``size`` train images drawn uniformly by ``rng`` (all when the set
    is smaller), decoded at the clients' ``shape`` (C, H, W) so one model reads both (§5.2)."""
    if len(shape) != 3 or shape[1] != shape[2] or shape[0] not in (1, 3):
        raise ValueError(f"an hf_image OOD pool needs square (C, H, W) client images, not {shape}")
    cfg = cfg.model_copy(update={"size": shape[1], "channels": shape[0]})
    cfg.check()
    ds = load_split(cfg, cfg.train_split)
    rows = np.sort(rng.permutation(len(ds))[:size]) if size < len(ds) else None
    y = column(ds, cfg.label_column)
    y = y if rows is None else y[rows]
    y, _, num_classes = label_ids(y, None, cfg.label_column, None)
    return images(ds, cfg, rows), y, max(num_classes, _classes(ds, cfg.label_column))
