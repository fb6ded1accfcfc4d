"""Loader for the released Flan subsets (FedOA spec §4.1): one folder per family of jsonl files.

Layout: ``<data_dir>/<family>/<name>_train.jsonl`` and ``<name>_test.jsonl``; every line is
``{"instruction": ..., "output": ..., "task": ..., "category": ...}``. The sub-dataset id is
``<name>`` and the family is the folder (FedOA spec §4.1 "Grouping"), not the ``category`` field.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np

from raysim.data.instructions import FAMILIES, TextExample

FLAN_SAMPLE_TAG = 13  # rng = default_rng([seed, FLAN_SAMPLE_TAG, crc32(name), split])
_FILE = re.compile(r"^(?P<name>.+)_(?P<split>train|test)\.jsonl?$")
SPLITS = ("train", "test")


def _family_files(folder: Path) -> dict[str, dict[str, Path]]:
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.iterdir()):
        m = _FILE.match(path.name)
        if m and path.is_file():
            found.setdefault(m["name"], {})[m["split"]] = path
    for name, files in found.items():
        missing = [s for s in SPLITS if s not in files]
        if missing:
            raise ValueError(f"{folder / name}: no {missing[0]} file ({name}_{missing[0]}.jsonl)")
    return found


def _read(files: dict[str, Path], cache_dir: str | None) -> dict[str, list[dict]]:
    import datasets

    data_files = {s: str(files[s]) for s in SPLITS}
    data = datasets.load_dataset("json", data_files=data_files, cache_dir=cache_dir)
    out = {}
    for split in SPLITS:
        ds = data[split]
        missing = [c for c in ("instruction", "output") if c not in ds.column_names]
        if missing:
            raise ValueError(f"{files[split]}: missing field(s) {missing}")
        out[split] = ds.select_columns(["instruction", "output"]).to_list()
    return out


def _subsample(rows: list[dict], n: int | None, seed: int, name: str, split: int) -> list[dict]:
    if n is None or n >= len(rows):
        return rows
    rng = np.random.default_rng([seed, FLAN_SAMPLE_TAG, zlib.crc32(name.encode()), split])
    return [rows[i] for i in np.sort(rng.choice(len(rows), size=n, replace=False))]


def load_flan(
    data_dir: str | Path,
    seed: int,
    n_train: int | None = None,
    n_test: int | None = None,
    cache_dir: str | None = None,
) -> dict[str, dict[str, list[TextExample]]]:
    """``{name: {"train": [...], "test": [...]}}`` from the released files (FedOA spec §4.1).

    Each split is down-sampled to ``n_train``/``n_test`` rows (a seeded subset kept in file
    order; all rows when there are fewer or ``None``). ``cache_dir`` goes to ``datasets``.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"flan data_dir {str(root)!r} is not a directory")
    missing = [f for f in FAMILIES if not (root / f).is_dir()]
    if missing:
        raise FileNotFoundError(f"flan data_dir {str(root)!r} lacks family folder(s) {missing}")
    tasks: dict[str, dict[str, list[TextExample]]] = {}
    for family in FAMILIES:
        files = _family_files(root / family)
        if not files:
            raise FileNotFoundError(f"{root / family}: no <name>_train/test.jsonl files")
        for name, paths in files.items():
            if name in tasks:
                raise ValueError(f"sub-dataset {name!r} appears in two family folders")
            rows = _read(paths, cache_dir)
            tasks[name] = {
                split: [
                    TextExample(str(r["instruction"]), str(r["output"]), name, family)
                    for r in _subsample(rows[split], n, seed, name, i)
                ]
                for i, (split, n) in enumerate(zip(SPLITS, (n_train, n_test), strict=True))
            }
    return tasks
