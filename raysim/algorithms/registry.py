"""Name → ``Method`` registry. A method file registers itself with ``@register`` at import."""

from __future__ import annotations

import difflib
import importlib

from .base import Method

_METHODS: dict[str, Method] = {}

#: Modules imported on first lookup, so that every built-in method is registered.
BUILTIN_MODULES = (
    "raysim.algorithms.fedavg",
    "raysim.algorithms.fedprox",
    "raysim.algorithms.fedadam",
    "raysim.algorithms.fedyogi",
    "raysim.algorithms.fedasync",
    "raysim.algorithms.fedbuff",
    "raysim.algorithms.fedit",
    "raysim.algorithms.fedoa",
    "raysim.algorithms.ditto",
    "raysim.algorithms.perada",
    "raysim.algorithms.pfedme",
    "raysim.algorithms.fedlora",
    "raysim.algorithms.fedsdr",
    "raysim.algorithms.centralized",
)


def register(method: Method) -> Method:
    """Add a method under ``method.name``; a second registration of the same name is an error."""
    if method.name in _METHODS and _METHODS[method.name] is not method:
        raise ValueError(f"method {method.name!r} is registered twice")
    _METHODS[method.name] = method
    return method


def _load_builtins() -> None:
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def get_method(name: str) -> Method:
    """Look up a method by name; the error names the closest registered one."""
    _load_builtins()
    if name not in _METHODS:
        close = difflib.get_close_matches(name, list(_METHODS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown algorithm {name!r}{hint}; known: {', '.join(sorted(_METHODS))}")
    return _METHODS[name]


def method_names() -> list[str]:
    _load_builtins()
    return sorted(_METHODS)
