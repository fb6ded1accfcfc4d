"""raysim: a Ray-native simulator for federated learning of foundation models."""

from raysim.api import Result, RunSession, run
from raysim.config import ConfigError, RunConfig, load_config

__all__ = ["ConfigError", "Result", "RunConfig", "RunSession", "load_config", "run"]
__version__ = "0.1.0"
