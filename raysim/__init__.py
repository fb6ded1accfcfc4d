"""raysim: a Ray-native simulator for federated learning of foundation models."""

from raysim.api import Result, RunSession, run
from raysim.config import ConfigError, RunConfig, load_config


def tune(*args, **kwargs):  # noqa: ANN002, ANN003 - see raysim.sweeps.tuner.tune
    """A Ray Tune sweep over raysim runs (``raysim.sweeps.tuner.tune``); imports Ray Tune."""
    from raysim.sweeps.tuner import tune as _tune

    return _tune(*args, **kwargs)


__all__ = ["ConfigError", "Result", "RunConfig", "RunSession", "load_config", "run", "tune"]
__version__ = "0.1.0"
