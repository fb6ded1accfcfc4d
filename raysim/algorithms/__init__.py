"""Federated methods: one file each, a ``Strategy`` and optionally a ``ClientAlgorithm``.

This package never imports Ray or MLflow. ``docs/architecture.md`` maps every hook.
"""

from ..models.layout import Layout, ParamGroup
from .base import (
    ClientAlgorithm,
    ClientContext,
    Downlink,
    Method,
    MethodParams,
    Needs,
    Strategy,
    Update,
)
from .context import ServerContext, ServerData, ServerPool
from .hooks import ClientBehaviour, HookParams, Mixer
from .private import PrivateTensors
from .registry import (
    BEHAVIOURS,
    MIXERS,
    Hook,
    get_method,
    load_plugin,
    method_names,
    register,
)

__all__ = [
    "BEHAVIOURS",
    "MIXERS",
    "ClientAlgorithm",
    "ClientBehaviour",
    "ClientContext",
    "Downlink",
    "Hook",
    "HookParams",
    "Layout",
    "Method",
    "MethodParams",
    "Needs",
    "Mixer",
    "ParamGroup",
    "PrivateTensors",
    "ServerContext",
    "ServerData",
    "ServerPool",
    "Strategy",
    "Update",
    "get_method",
    "load_plugin",
    "method_names",
    "register",
]
