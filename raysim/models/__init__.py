"""Model zoo behind a registry: ``build_model(config, data_spec)``.

The registry knows every built-in model by name and imports a zoo module (and torch) only when
one of its models is built, so that configs load without torch. The names below load on first
use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DataSpec": "raysim.models.registry",
    "ModelConfig": "raysim.models.registry",
    "build_handle": "raysim.models.registry",
    "build_model": "raysim.models.registry",
    "register_model": "raysim.models.registry",
    "ModelHandle": "raysim.models.handle",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'raysim.models' has no attribute {name!r}")
