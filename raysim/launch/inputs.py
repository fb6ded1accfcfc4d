"""The files and folders a config names, checked before Ray starts (``api.preflight``).

Relative paths are read from the working directory, as every part of raysim reads them; the
error says which directory that was. Only what is certainly local is checked: a FedBaF
foundation, Flan's released data and a Flan tokenizer folder, image or data folders given to a
``datasets`` folder builder, a dataset saved with ``save_to_disk``; and ``model.path`` or
``data.tokenizer`` where they are written as paths (``/``, ``./``, ``../``, ``~``, or a first folder
that exists here), not as Hugging Face hub ids.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: ``datasets`` builders that read a local folder (``data_dir``)
FOLDER_BUILDERS = ("imagefolder", "audiofolder", "csv", "json", "parquet", "text", "arrow")


class MissingInput(ValueError):
    """A file or folder the config names is not there."""


def written_as_path(value: str) -> bool:
    first = Path(value).parts[0] if Path(value).parts else ""
    return value.startswith(("/", "./", "../", "~")) or (
        os.sep in value and Path(first).expanduser().is_dir()
    )


def named_inputs(cfg: Any) -> Iterator[tuple[str, str, str]]:
    """``(config key, path, what to do if it is missing)`` for each local input of ``cfg``."""
    params = cfg.algorithm.params
    foundation = getattr(params, "foundation", None)
    if isinstance(foundation, str):
        yield "algorithm.foundation", foundation, "foundation"
    for i, hook in enumerate(cfg.hooks.server):
        path = getattr(hook.params, "foundation", None)
        if isinstance(path, str):
            yield f"hooks.server[{i}].foundation ({hook.name})", path, "foundation"
    yield from cfg.data.local_inputs()
    if cfg.model.path and written_as_path(cfg.model.path):
        yield "model.path", cfg.model.path, "the model's weights"


def check_inputs(cfg: Any) -> None:
    """Raise ``MissingInput`` (one line) for the first input of ``cfg`` that is not there."""
    for key, value, what in named_inputs(cfg):
        path = Path(value).expanduser()
        if path.exists():
            continue
        where = "" if path.is_absolute() else f" (relative paths are read from {Path.cwd()})"
        hint = f" ({what})"
        if what == "foundation":
            hint = f"; {_foundation_hint(path)}"
        elif what == "tokenizer":
            hint = (
                " (a tokenizer folder: `raysim pretrain tiny-llama --out PATH` makes the tiny "
                "foundation, its model and tokenizer)"
            )
        raise MissingInput(f"{key}: {value} does not exist{where}{hint}")


def _foundation_hint(path: Path) -> str:
    from raysim.algorithms.fedbaf.mixer import how_to_make

    return how_to_make(path)
