"""Every registry of the package: methods (``register``), server mixers (``MIXERS``) and client
behaviours (``BEHAVIOURS``), and the one list of built-in modules that fills them.

Each lookup has two halves. The torch-free half (``method_spec``, ``HookRegistry.spec``: params,
needs, where the implementation lives) is what a config is checked against, in the driver and in
each Tune trial before any model loads. The implementation (``get_method``, ``HookRegistry.get``)
is imported where a method or hook is built: the coordinator and the workers.

Where they come from, in every process that looks one up:

- ``BUILTIN_SPECS`` below: one torch-free ``params`` module per paper package, imported on the
  first lookup; each lists its ``SPECS`` (``MethodSpec`` / ``HookSpec``), and each spec names the
  module that registers its implementation (``Method.of(spec, ...)``, ``Hook.of(spec, cls)``);
- packages that declare a ``raysim.methods`` entry point (``[project.entry-points."raysim.methods"]
  my_method = "my_pkg.my_method"``), loaded when a name is not a built-in one;
- a user's module named in the config (``algorithm.module``, or ``module:`` on a ``hooks.server``
  / ``hooks.clients`` entry: a dotted name or a ``.py`` file), imported by ``load_plugin`` when
  the config is validated, which every process does. What it registers is its own spec.

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
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .spec import HookParams, HookSpec, MethodSpec

if TYPE_CHECKING:
    from .base import Method
    from .hooks import ClientBehaviour, Mixer

_METHODS: dict[str, Method] = {}
_SPECS: dict[str, MethodSpec] = {}
ENTRY_POINT_GROUP = "raysim.methods"

#: The built-in specs, imported on first lookup: one torch-free module per paper package, plus
#: the general-purpose methods every paper compares with. Each lists its methods' and hooks'
#: specs in ``SPECS``.
BUILTIN_SPECS = (
    "raysim.algorithms.general.params",
    "raysim.algorithms.feddle.params",
    "raysim.algorithms.fedbaf.params",
    "raysim.algorithms.fedoa.params",
    "raysim.algorithms.fedot.params",
)
_specs_loaded = False
_entry_points_loaded = False


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
    source is an error (re-importing the same file, e.g. as a plugin and by hand, is not). A
    built-in name must be registered from its spec (``Method.of``)."""
    _load_specs()
    builtin = _BUILTIN_METHODS.get(method.name)
    if builtin is not None and (method.params, method.needs) != (builtin.params, builtin.needs):
        raise ValueError(f"method {method.name!r} is registered twice (it is a built-in method)")
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
    _SPECS[method.name] = builtin or method.spec
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


_BUILTIN_METHODS: dict[str, MethodSpec] = {}
_BUILTIN_HOOKS: dict[str, dict[str, HookSpec]] = {}


def _load_specs() -> None:
    """Import the built-in spec modules (torch-free) once."""
    global _specs_loaded
    if _specs_loaded:
        return
    _specs_loaded = True
    for module in BUILTIN_SPECS:
        for spec in importlib.import_module(module).SPECS:
            if isinstance(spec, MethodSpec):
                _BUILTIN_METHODS[spec.name] = spec
                _SPECS[spec.name] = spec
            else:
                _BUILTIN_HOOKS.setdefault(spec.kind, {})[spec.name] = spec


def _load_entry_points() -> None:
    """Import the modules that installed packages declare as ``raysim.methods`` once."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:  # noqa: BLE001 - name the broken plugin, do not hide it
            raise PluginError(f"entry point {ep.name!r} ({ep.value}) failed to load: {e}") from e


def _unknown(kind: str, name: str, known: list[str]) -> KeyError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return KeyError(f"unknown {kind} {name!r}{hint}; known: {', '.join(sorted(known))}")


T = TypeVar("T")


@dataclass(frozen=True)
class Hook(Generic[T]):
    """A registered hook: name, implementation class, params class, reference."""

    name: str
    cls: type[T]
    params: type[HookParams] = HookParams
    reference: str = ""

    @classmethod
    def of(cls, spec: HookSpec, implementation: type[T]) -> Hook[T]:
        """A built-in hook: name, params and reference from its torch-free ``spec``."""
        return cls(spec.name, implementation, spec.params, spec.reference)

    def build(self, params: Mapping[str, Any] | HookParams) -> T:
        if not isinstance(params, HookParams):
            params = self.params(**params)
        return self.cls(params)


class HookRegistry(Generic[T]):
    """Name → ``Hook`` for one kind of hook (``spec`` for its torch-free half)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._hooks: dict[str, Hook[T]] = {}
        self._specs: dict[str, HookSpec] = {}

    def _builtin(self) -> dict[str, HookSpec]:
        _load_specs()
        return _BUILTIN_HOOKS.get(self.kind, {})

    def register(self, hook: Hook[T]) -> Hook[T]:
        builtin = self._builtin().get(hook.name)
        if builtin is not None and hook.params is not builtin.params:
            raise ValueError(f"{self.kind} {hook.name!r} is registered twice (it is built in)")
        old = self._hooks.get(hook.name)
        if old is not None and old is not hook:
            same = old.cls.__qualname__ == hook.cls.__qualname__ and _file(old.cls) == _file(
                hook.cls
            )
            if not same:
                raise ValueError(f"{self.kind} {hook.name!r} is registered twice")
        self._hooks[hook.name] = hook
        self._specs[hook.name] = builtin or HookSpec(
            self.kind, hook.name, hook.cls.__module__, hook.params, hook.reference
        )
        return hook

    def spec(self, name: str) -> HookSpec:
        """The hook's params and reference, without importing its implementation."""
        found = self._builtin().get(name) or self._specs.get(name)
        if found is None:
            _load_entry_points()
            found = self._specs.get(name)
        if found is None:
            raise _unknown(self.kind, name, self.names())
        return found

    def get(self, name: str) -> Hook[T]:
        """The hook, its implementation imported."""
        spec = self.spec(name)
        if name not in self._hooks:
            importlib.import_module(spec.module)
        return self._hooks[name]

    def names(self) -> list[str]:
        _load_entry_points()
        return sorted(set(self._builtin()) | set(self._specs))


MIXERS: HookRegistry[Mixer] = HookRegistry("server hook")
BEHAVIOURS: HookRegistry[ClientBehaviour] = HookRegistry("client behaviour")


def method_spec(name: str) -> MethodSpec:
    """A method's params, needs and reference, without importing its implementation; the error
    names the closest known method."""
    _load_specs()
    if name not in _SPECS:
        _load_entry_points()
    if name not in _SPECS:
        raise _unknown("algorithm", name, method_names())
    return _SPECS[name]


def get_method(name: str) -> Method:
    """A method, its implementation imported; the error names the closest known one."""
    spec = method_spec(name)
    if name not in _METHODS:
        importlib.import_module(spec.module)
    return _METHODS[name]


def method_names() -> list[str]:
    _load_specs()
    _load_entry_points()
    return sorted(_SPECS)
