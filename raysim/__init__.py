"""raysim: a Ray-native simulator for federated learning of foundation models.

The names below load on first use, so that ``raysim --help`` (and any ``raysim.*`` module that
needs neither) does not wait for torch and the config's validation to import.
"""

from __future__ import annotations

from raysim import _moved
from raysim.util.lazy import lazy_getattr

_moved.install()

_LAZY = {
    "Result": "raysim.launch.session",
    "RunSession": "raysim.launch.session",
    "run": "raysim.launch.session",
    "ConfigError": "raysim.config",
    "RunConfig": "raysim.config",
    "load_config": "raysim.config",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


def tune(*args, **kwargs):  # noqa: ANN002, ANN003 - see raysim.sweeps.tuner.tune
    """A Ray Tune sweep over raysim runs (``raysim.sweeps.tuner.tune``); imports Ray Tune."""
    from raysim.sweeps.tuner import tune as _tune

    return _tune(*args, **kwargs)


__all__ = ["ConfigError", "Result", "RunConfig", "RunSession", "load_config", "run", "tune"]
__version__ = "0.1.0"
