"""Model zoo behind a registry: ``build_model(config, data_spec)``.

The registry knows no model; the zoo modules register theirs on import, here, once.
"""

from raysim.models import (  # noqa: F401  (register the built-in models)
    causal_lm,
    lm_classifier,
    small,
    tf_nets,
    vision,
)
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
