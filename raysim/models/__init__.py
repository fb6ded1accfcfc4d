"""Model zoo behind a registry: ``build_model(config, data_spec)``.

The registry knows every built-in model by name and imports a zoo module (and torch) only when
one of its models is built, so that configs load without torch. The names below load on first
use.
"""

from __future__ import annotations

from raysim.util.lazy import lazy_getattr

_EXPORTS = {
    "DataSpec": "raysim.models.registry",
    "ModelConfig": "raysim.models.registry",
    "build_handle": "raysim.models.registry",
    "build_model": "raysim.models.registry",
    "register_model": "raysim.models.registry",
    "ModelHandle": "raysim.models.handle",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)
