"""Every registry of the package: methods (``register``), server mixers (``MIXERS``) and client
behaviours (``BEHAVIOURS``), and the one list of built-in modules that fills them.

Each lookup has two halves. The torch-free half (``method_spec``, ``MIXERS.spec``: params,
needs, where the implementation lives) is what a config is checked against, in the driver and in
each Tune trial before any model loads. The implementation (``get_method``, ``MIXERS.get``)
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
  ``module_policy`` says when that import may happen: never in a dry run (``skip``: nothing the
  config names runs), and for a config that came from a checkpoint or an MLflow run only when
  the user says they trust it (``refuse`` otherwise).

No interface module imports an implementation: the built-in list is strings, imported here.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .interface import check_overrides, check_wrap_model
from .spec import HookParams, HookSpec, MethodSpec

if TYPE_CHECKING:
    from .base import Method
    from .hooks import ClientBehaviour, Mixer

ENTRY_POINT_GROUP = "raysim.methods"
"""The entry-point group in which an installed package names its method modules."""

BUILTIN_SPECS = (
    "raysim.algorithms.general.params",
    "raysim.algorithms.feddle.params",
    "raysim.algorithms.fedbaf.params",
    "raysim.algorithms.fedoa.params",
    "raysim.algorithms.fedot.params",
)
"""The built-in specs, imported on first lookup: one torch-free module per paper package, plus
the general-purpose methods every paper compares with. Each lists its methods' and hooks'
specs in ``SPECS``."""
#: kind ("algorithm", "server hook", "client behaviour") → name → the built-in's spec
_BUILTIN: dict[str, dict[str, Any]] = {}
_specs_loaded = False
_entry_points_loaded = False


class PluginError(ValueError):
    """A method module named in the config (or by an entry point) could not be imported."""


@dataclass(frozen=True)
class ModulePolicy:
    """Whether ``load_plugin`` imports: ``import``; ``skip`` (a dry run: the module is only
    located, and names it alone would register are left unchecked); ``refuse`` (a config from
    ``source``, a checkpoint or an MLflow run, that the user has not said they trust)."""

    mode: str = "import"
    """``import``, ``skip`` or ``refuse``."""
    source: str = ""
    """Where a refused config came from, as the refusal names it."""


_IMPORT = ModulePolicy()  # frozen: safe to share as the default
_POLICY: ContextVar[ModulePolicy] = ContextVar("raysim_module_policy", default=_IMPORT)  # noqa: B039
TRUST_FLAG = "--trust-modules"
"""The flag (CLI) or argument (API) that lets a stored config's modules be imported."""


@contextmanager
def module_policy(mode: str, source: str = "") -> Iterator[None]:
    """Validate configs inside the block under ``mode`` (see ``ModulePolicy``)."""
    if mode not in ("import", "skip", "refuse"):
        raise ValueError(f"unknown module policy {mode!r}")
    token = _POLICY.set(ModulePolicy(mode, source))
    try:
        yield
    finally:
        _POLICY.reset(token)


def modules_skipped() -> bool:
    """Whether a module named by the config being validated was left unimported (a dry run)."""
    return _POLICY.get().mode == "skip"


def _is_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def _locate(spec: str) -> str:
    """The canonical spec of a module, found without running any of its code."""
    if _is_path(spec):
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"module: no such file {spec!r}")
        return str(path)
    from importlib.machinery import PathFinder

    top = spec.split(".")[0]
    if top not in sys.modules and PathFinder.find_spec(top) is None:
        raise PluginError(f"module {spec!r} cannot be found (is it installed or on PYTHONPATH?)")
    return spec


def load_plugin(spec: str) -> str:
    """Import a user's module (methods, mixers or behaviours): a dotted name or a ``.py`` path,
    as ``module_policy`` allows.

    Returns the canonical spec (a file path made absolute), which the config stores so that every
    Ray process imports the same thing. Importing twice is harmless.
    """
    policy = _POLICY.get()
    if policy.mode == "refuse":
        raise PluginError(
            f"module {spec!r} is named by {policy.source or 'a stored config'}, not by a file you "
            f"gave: raysim imports no code from a checkpoint or a tracking store unless told to; "
            f"if you trust it, pass {TRUST_FLAG}"
        )
    if policy.mode == "skip":
        return _locate(spec)
    if _is_path(spec):
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


def _load_specs() -> None:
    """Import the built-in spec modules (torch-free) once."""
    global _specs_loaded
    if _specs_loaded:
        return
    _specs_loaded = True
    for module in BUILTIN_SPECS:
        for spec in importlib.import_module(module).SPECS:
            _BUILTIN.setdefault(spec.kind, {})[spec.name] = spec


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


def _file(obj: type) -> str | None:
    try:
        return inspect.getsourcefile(obj) or None
    except TypeError:
        return None


T = TypeVar("T")
S = TypeVar("S", MethodSpec, HookSpec)


class Registry(Generic[T, S]):
    """Name → implementation for one kind (methods, server hooks or client behaviours), each with
    its torch-free spec. A built-in is known by its spec from the start and its implementation's
    module is imported on ``get``; a plugin is known once it registers."""

    def __init__(
        self,
        kind: str,
        spec_of: Callable[[T], S],
        source: Callable[[T], Hashable],
        check: Callable[[T], None],
    ) -> None:
        self.kind = kind
        """What it holds (``algorithm``, ``server hook`` or ``client behaviour``), as its errors
        say."""
        self._spec_of = spec_of  # a registered implementation's spec
        self._source = source  # what tells two registrations of one name apart
        self._check = check  # refuses callables of another shape than the interface's
        self._registered: dict[str, T] = {}
        self._plugin_specs: dict[str, S] = {}

    def _builtin(self) -> dict[str, S]:
        _load_specs()
        return _BUILTIN.get(self.kind, {})

    def register(self, entry: T) -> T:
        """Add ``entry`` under its name. A built-in name takes only the implementation built from
        its spec (``Method.of``, ``Hook.of``); another source under a taken name is an error
        (re-importing the same file, e.g. as a plugin and by hand, is not); so is a callable that
        does not take the call the interface makes of it (``interface.InterfaceError``)."""
        spec = self._spec_of(entry)
        self._check(entry)
        builtin = self._builtin().get(spec.name)
        if builtin is not None and dataclasses.replace(spec, module=builtin.module) != builtin:
            raise ValueError(f"{self.kind} {spec.name!r} is registered twice (it is built in)")
        old = self._registered.get(spec.name)
        if old is not None and old is not entry and self._source(old) != self._source(entry):
            raise ValueError(f"{self.kind} {spec.name!r} is registered twice")
        self._registered[spec.name] = entry
        if builtin is None:
            self._plugin_specs[spec.name] = spec
        return entry

    def spec(self, name: str) -> S:
        """The torch-free half (params, needs, reference), without importing the implementation;
        the error names the closest known name."""
        found = self._builtin().get(name) or self._plugin_specs.get(name)
        if found is None:
            _load_entry_points()
            found = self._plugin_specs.get(name)
        if found is None:
            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KeyError(f"unknown {self.kind} {name!r}{hint}; known: {', '.join(self.names())}")
        return found

    def get(self, name: str) -> T:
        """The implementation, its module imported."""
        spec = self.spec(name)
        if name not in self._registered:
            importlib.import_module(spec.module)
        return self._registered[name]

    def names(self) -> list[str]:
        """Every known name of this kind, sorted: the built-ins, the entry points' and those
        registered so far."""
        _load_entry_points()
        return sorted(set(self._builtin()) | set(self._plugin_specs))


@dataclass(frozen=True)
class Hook(Generic[T]):
    """A registered hook: name, implementation class, params class, reference."""

    name: str
    """The name a config gives it (a ``hooks.server`` or ``hooks.clients`` entry's ``name``)."""
    cls: type[T]
    """The implementation, a ``Mixer`` or ``ClientBehaviour`` subclass."""
    params: type[HookParams] = HookParams
    """Its parameters class, which validates the entry's other keys."""
    reference: str = ""
    """The paper (and section) it comes from."""

    @classmethod
    def of(cls, spec: HookSpec, implementation: type[T]) -> Hook[T]:
        """A built-in hook: name, params and reference from its torch-free ``spec``."""
        hook = cls(spec.name, implementation, spec.params, spec.reference)
        for flag, said, method, overridden in (
            ("secrets", spec.secrets, "secrets", hook.declares_secrets),
            ("forges", spec.forges, "forge", hook.forges),
        ):
            if overridden != said:
                does = "does not override" if said else "overrides"
                raise ValueError(
                    f"{spec.name}: its spec says {flag}={said}, its class "
                    f"{implementation.__name__} {does} {method}()"
                )
        return hook

    @property
    def forges(self) -> bool:
        """Whether it is a client behaviour whose updates the server forges (overrides
        ``ClientBehaviour.forge``)."""
        from .hooks import ClientBehaviour

        return issubclass(self.cls, ClientBehaviour) and self.cls.forge is not ClientBehaviour.forge

    @property
    def declares_secrets(self) -> bool:
        """Whether it is a mixer that declares server-private values (overrides
        ``Mixer.secrets``): the leak auditor is then on by default (``audit.leaks``)."""
        from .hooks import Mixer

        return issubclass(self.cls, Mixer) and self.cls.secrets is not Mixer.secrets

    def build(self, params: Mapping[str, Any] | HookParams) -> T:
        """An instance of ``cls``, given its params or the config's entries for them."""
        if not isinstance(params, HookParams):
            params = self.params(**params)
        return self.cls(params)


def _check_method(method: Method) -> None:
    from .base import ClientAlgorithm, Strategy

    owner = f"method {method.name!r}"
    check_overrides(method.strategy, Strategy, owner)
    check_overrides(method.client, ClientAlgorithm, owner)
    check_wrap_model(method.wrap_model, owner)


def _check_hook(base: str) -> Callable[[Hook[Any]], None]:
    def check(hook: Hook[Any]) -> None:
        from . import hooks

        check_overrides(hook.cls, getattr(hooks, base), f"hook {hook.name!r}")

    return check


def _hooks(kind: str, base: str) -> Registry[Any, HookSpec]:
    return Registry(
        kind,
        lambda h: HookSpec(
            kind, h.name, h.cls.__module__, h.params, h.reference, h.declares_secrets, h.forges
        ),
        lambda h: (h.cls.__qualname__, _file(h.cls)),
        _check_hook(base),
    )


ALGORITHMS: Registry[Method, MethodSpec] = Registry(
    MethodSpec.kind,
    lambda m: m.spec,
    lambda m: (m.strategy.__qualname__, m.client.__qualname__, _file(m.strategy)),
    _check_method,
)
"""The methods' registry: name → ``Method`` (``register``, ``method_spec``, ``get_method``)."""
MIXERS: Registry[Mixer, HookSpec] = _hooks("server hook", "Mixer")
"""The server hooks' registry (``hooks.server``): name → ``Hook`` of a ``Mixer``."""
BEHAVIOURS: Registry[ClientBehaviour, HookSpec] = _hooks("client behaviour", "ClientBehaviour")
"""The client behaviours' registry (``hooks.clients``): name → ``Hook`` of a
``ClientBehaviour``."""
# the method registry's operations, by the names methods and docs use
register = ALGORITHMS.register
"""Register a ``Method`` under its name and return it: ``METHOD = register(Method(...))`` at
the top of a plugin's module. Its callables are checked against the interface, and a name
another source registered, or a built-in's, is refused (``Registry.register``)."""
method_spec = ALGORITHMS.spec
"""A method's torch-free ``MethodSpec`` by name, its implementation not imported
(``Registry.spec``)."""
get_method = ALGORITHMS.get
"""A method's ``Method`` by name, its module imported (``Registry.get``)."""
method_names = ALGORITHMS.names
"""Every known method's name, sorted (``Registry.names``)."""
