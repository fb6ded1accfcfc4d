"""Package attributes that load on first use (PEP 562), so that importing a package does not
import torch, Ray or the config's validation before a name that needs them is used."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(
    package: str, exports: Mapping[str, str], moved: bool = False
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``exports`` maps a name to the module (absolute,
    or relative to ``package``) that defines it; the value is kept on the package once loaded.
    ``moved``: the names are old ones that now live there: each use warns
    (``DeprecationWarning``, naming the new place) and nothing is kept, so every use warns."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        home = importlib.import_module(module, package)
        value = getattr(home, name)
        if moved:
            warnings.warn(
                f"{package}.{name} moved to {home.__name__}.{name}; the old name goes in the "
                "next release",
                DeprecationWarning,
                stacklevel=2,
            )
        else:
            setattr(sys.modules[package], name, value)
        return value

    return __getattr__
