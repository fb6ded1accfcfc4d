"""Federated methods: one package per paper, each method a ``Strategy`` and optionally a
``ClientAlgorithm``, its parameters and needs in the package's torch-free ``params`` module.

This package never imports Ray or MLflow. ``docs/architecture.md`` maps every hook. The names
below load on first use, so that a config can be checked (``spec``, ``registry``) without torch.
"""

from __future__ import annotations

from ..util.lazy import lazy_getattr

_EXPORTS = {
    "Layout": "..models.layout",
    "ParamGroup": "..models.layout",
    "ClientAlgorithm": ".base",
    "ClientContext": ".base",
    "Downlink": ".base",
    "Method": ".base",
    "Strategy": ".base",
    "Update": ".base",
    "MethodParams": ".spec",
    "MethodSpec": ".spec",
    "HookParams": ".spec",
    "HookSpec": ".spec",
    "Needs": ".spec",
    "ServerContext": ".context",
    "ServerData": ".context",
    "ServerPool": ".context",
    "ClientBehaviour": ".hooks",
    "Mixer": ".hooks",
    "PrivateTensors": ".private",
    "BEHAVIOURS": ".registry",
    "MIXERS": ".registry",
    "Hook": ".registry",
    "Registry": ".registry",
    "get_method": ".registry",
    "load_plugin": ".registry",
    "method_names": ".registry",
    "method_spec": ".registry",
    "register": ".registry",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)
