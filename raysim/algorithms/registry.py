"""Name → ``Method`` registry. A method file registers itself with ``@register`` at import.

Where methods come from, in every process that looks one up (the driver, the coordinator and
each worker):

- the built-in modules below;
- packages that declare a ``raysim.methods`` entry point (``[project.entry-points."raysim.methods"]
  my_method = "my_pkg.my_method"``);
- a user's module named in the config (``algorithm.module``: a dotted name or a ``.py`` file),
  imported by ``load_plugin`` when the config is validated, which every process does.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import sys
from importlib.metadata import entry_points
from pathlib import Path

from .base import Method

_METHODS: dict[str, Method] = {}
ENTRY_POINT_GROUP = "raysim.methods"

#: Modules imported on first lookup, so that every built-in method is registered.
BUILTIN_MODULES = (
    "raysim.algorithms.fedavg",
    "raysim.algorithms.fedprox",
    "raysim.algorithms.fedadam",
    "raysim.algorithms.fedyogi",
    "raysim.algorithms.fedasync",
    "raysim.algorithms.fedbuff",
    "raysim.algorithms.ca2fl",
    "raysim.algorithms.center",
    "raysim.algorithms.fedft",
    "raysim.algorithms.hfcl",
    "raysim.algorithms.feddf",
    "raysim.algorithms.feddle",
    "raysim.algorithms.fedbaf_method",
    "raysim.algorithms.fedit",
    "raysim.algorithms.fedoa",
    "raysim.algorithms.ditto",
    "raysim.algorithms.perada",
    "raysim.algorithms.pfedme",
    "raysim.algorithms.fedlora",
    "raysim.algorithms.fedsdr",
    "raysim.algorithms.centralized",
)
_loaded = False


class PluginError(ValueError):
    """A method module named in the config (or by an entry point) could not be imported."""


def _source(method: Method) -> str | None:
    try:
        return inspect.getsourcefile(method.strategy) or None
    except TypeError:
        return None


def register(method: Method) -> Method:
    """Add a method under ``method.name``; a second registration of the same name from another
    source is an error (re-importing the same file, e.g. as a plugin and by hand, is not)."""
    old = _METHODS.get(method.name)
    if old is not None and old is not method:
        same = (
            old.strategy.__qualname__ == method.strategy.__qualname__
            and old.client.__qualname__ == method.client.__qualname__
            and _source(old) == _source(method)
        )
        if not same:
            raise ValueError(f"method {method.name!r} is registered twice")
    _METHODS[method.name] = method
    return method


def load_plugin(spec: str) -> str:
    """Import a user's method module: a dotted module name or a path to a ``.py`` file.

    Returns the canonical spec (a file path made absolute), which the config stores so that every
    Ray process imports the same thing. Importing twice is harmless.
    """
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"algorithm.module: no such file {spec!r}")
        name = "raysim_plugin_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
        if name not in sys.modules:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[name]
                raise PluginError(f"algorithm.module {str(path)!r} failed to import: {e}") from e
        return str(path)
    try:
        importlib.import_module(spec)
    except ImportError as e:
        raise PluginError(
            f"algorithm.module {spec!r} cannot be imported ({e}); is it installed, or on "
            "PYTHONPATH in every Ray process?"
        ) from e
    return spec


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - name the broken plugin, do not hide it
            raise PluginError(f"entry point {ep.name!r} ({ep.value}) failed to load: {e}") from e


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
