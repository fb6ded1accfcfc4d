"""Every registry of the package: methods (``register``), server mixers (``MIXERS``) and client
behaviours (``BEHAVIOURS``), and the one list of built-in modules that fills them.

Where implementations come from, in every process that looks one up (the driver, the coordinator
and each worker):

- ``BUILTIN_MODULES`` below, imported on the first lookup of any registry; each module registers
  what it defines (a method with ``@register``-style calls, a hook with ``MIXERS.register`` /
  ``BEHAVIOURS.register``);
- packages that declare a ``raysim.methods`` entry point (``[project.entry-points."raysim.methods"]
  my_method = "my_pkg.my_method"``);
- a user's module named in the config (``algorithm.module``, or ``module:`` on a ``hooks.server``
  / ``hooks.clients`` entry: a dotted name or a ``.py`` file), imported by ``load_plugin`` when
  the config is validated, which every process does.

No interface module imports an implementation: the built-in list is strings, imported here.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Generic, TypeVar

from .base import Method
from .hooks import ClientBehaviour, HookParams, Mixer

_METHODS: dict[str, Method] = {}
ENTRY_POINT_GROUP = "raysim.methods"

#: The built-in modules, imported on first lookup: each registers its methods, mixers and
#: behaviours. One package per paper, plus the general-purpose methods every paper compares with.
BUILTIN_MODULES = (
    # general-purpose methods, mixers and behaviours
    "raysim.algorithms.general.fedavg",
    "raysim.algorithms.general.fedprox",
    "raysim.algorithms.general.fedadam",
    "raysim.algorithms.general.fedyogi",
    "raysim.algorithms.general.fedasync",
    "raysim.algorithms.general.fedbuff",
    "raysim.algorithms.general.ca2fl",
    "raysim.algorithms.general.mixers",
    "raysim.algorithms.general.behaviours",
    # Feddle (feddle.md) and its server-data baselines
    "raysim.algorithms.feddle.center",
    "raysim.algorithms.feddle.fedft",
    "raysim.algorithms.feddle.hfcl",
    "raysim.algorithms.feddle.feddf",
    "raysim.algorithms.feddle.method",
    # FedBaF (fedbaf.md): the mixer, the method, the adversaries
    "raysim.algorithms.fedbaf.mixer",
    "raysim.algorithms.fedbaf.method",
    "raysim.algorithms.fedbaf.adversaries",
    # FedOA (fedoa.md) and its personalised-adapter baselines
    "raysim.algorithms.fedoa.fedit",
    "raysim.algorithms.fedoa.method",
    "raysim.algorithms.fedoa.ditto",
    "raysim.algorithms.fedoa.perada",
    "raysim.algorithms.fedoa.pfedme",
    "raysim.algorithms.fedoa.fedlora",
    "raysim.algorithms.fedoa.fedsdr",
    "raysim.algorithms.fedoa.centralized",
    # FedOT (fedot.md) and its personalisation baselines
    "raysim.algorithms.fedot.method",
    "raysim.algorithms.fedot.baselines",
)
_loaded = False


class PluginError(ValueError):
    """A method module named in the config (or by an entry point) could not be imported."""


def _file(obj: type) -> str | None:
    try:
        return inspect.getsourcefile(obj) or None
    except TypeError:
        return None


def _source(method: Method) -> str | None:
    return _file(method.strategy)


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
    """Import a user's module (methods, mixers or behaviours): a dotted name or a ``.py`` path.

    Returns the canonical spec (a file path made absolute), which the config stores so that every
    Ray process imports the same thing. Importing twice is harmless.
    """
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"module: no such file {spec!r}")
        name = "raysim_plugin_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
        if name not in sys.modules:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            try:
                loader_spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[name]
                raise PluginError(f"module {str(path)!r} failed to import: {e}") from e
        return str(path)
    try:
        importlib.import_module(spec)
    except ImportError as e:
        raise PluginError(
            f"module {spec!r} cannot be imported ({e}); is it installed, or on "
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


T = TypeVar("T")


@dataclass(frozen=True)
class Hook(Generic[T]):
    """A registered hook: name, implementation class, params class, reference."""

    name: str
    cls: type[T]
    params: type[HookParams] = HookParams
    reference: str = ""

    def build(self, params: Mapping[str, Any] | HookParams) -> T:
        if not isinstance(params, HookParams):
            params = self.params(**params)
        return self.cls(params)


class HookRegistry(Generic[T]):
    """Name → ``Hook`` for one kind of hook; lookups load the built-in modules first."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._hooks: dict[str, Hook[T]] = {}

    def register(self, hook: Hook[T]) -> Hook[T]:
        old = self._hooks.get(hook.name)
        if old is not None and old is not hook:
            same = old.cls.__qualname__ == hook.cls.__qualname__ and _file(old.cls) == _file(
                hook.cls
            )
            if not same:
                raise ValueError(f"{self.kind} {hook.name!r} is registered twice")
        self._hooks[hook.name] = hook
        return hook

    def get(self, name: str) -> Hook[T]:
        _load_builtins()
        if name not in self._hooks:
            close = difflib.get_close_matches(name, list(self._hooks), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KeyError(f"unknown {self.kind} {name!r}{hint}; known: {', '.join(self.names())}")
        return self._hooks[name]

    def names(self) -> list[str]:
        _load_builtins()
        return sorted(self._hooks)


MIXERS: HookRegistry[Mixer] = HookRegistry("server hook")
BEHAVIOURS: HookRegistry[ClientBehaviour] = HookRegistry("client behaviour")


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
