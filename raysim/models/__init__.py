"""Model zoo behind a registry: ``build_model(config, data_spec)``."""

from raysim.models.handle import ModelHandle
from raysim.models.registry import (
    DataSpec,
    ModelConfig,
    build_handle,
    build_model,
    register_model,
)

__all__ = [
    "DataSpec",
    "ModelConfig",
    "ModelHandle",
    "build_handle",
    "build_model",
    "register_model",
]
