"""The method interface's version, and the check of what a plugin registers against it.

Every change of the interface is in ``CHANGELOG.md`` under its version. A registration
(``register``, ``Hook`` entries) is checked here: each callable a plugin overrides must accept the
call the runtime makes, so that code written against an earlier interface is refused in one line
when it registers, naming the expected signature, not with a ``TypeError`` inside a worker.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

INTERFACE_VERSION = "3.8"
"""The method interface's version, MAJOR.MINOR (``raysim methods`` prints it): a major step
changes a call plugins make or receive, a minor one adds to it."""

CHANGED: dict[str, str] = {
    "wrap_model": "2.0 added params (the method's parameters)",
}
"""Where a callable's shape changed, what changed: a hint on the refusal (``CHANGELOG.md`` has
every change)."""

WRAP_MODEL = inspect.Signature(
    [
        inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in ("module", "spec", "params")
    ]
)
"""The call the runtime makes of ``Method.wrap_model``: ``(module, spec, params)``."""


class InterfaceError(TypeError):
    """A plugin's callable does not take the call the method interface makes of it."""


def accepts(signature: inspect.Signature, expected: inspect.Signature) -> bool:
    """Whether a callable of ``signature`` takes every call a caller of ``expected`` may make:
    its positional arguments in order, and its keyword-only ones by name."""
    positional = [
        p
        for p in expected.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    keywords = {p.name: None for p in expected.parameters.values() if p.kind is p.KEYWORD_ONLY}
    try:  # binds only where every parameter the caller never passes has a default
        signature.bind(*range(len(positional)), **keywords)
    except TypeError:
        return False
    return True


def _shown(name: str, signature: inspect.Signature) -> str:
    """``name(a, b=1, *rest)``: the call's shape, without annotations."""
    bare = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    return f"{name}{signature.replace(parameters=bare, return_annotation=signature.empty)}"


def _refusal(
    owner: str, name: str, got: inspect.Signature, expected: inspect.Signature, given: str = ""
) -> str:
    """One line: what was given (``given``: the callable's own name, where it differs), what the
    interface calls, and when that changed."""
    shown = f"{name}={_shown(given, got)}" if given else _shown(name, got)
    changed = f"; {CHANGED[name]}" if name in CHANGED else ""
    return (
        f"{owner}: {shown} does not match the method interface {INTERFACE_VERSION}, which "
        f"calls {_shown(name, expected)}{changed} (CHANGELOG.md)"
    )


def check_overrides(cls: type, base: type, owner: str) -> None:
    """Refuse ``cls`` where a method it defines over ``base``'s does not take ``base``'s call."""
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise InterfaceError(f"{owner}: {cls!r} is not a subclass of {base.__name__}")
    for klass in cls.__mro__:
        if klass is base or not issubclass(klass, base):
            break
        for name, member in vars(klass).items():
            theirs = inspect.getattr_static(base, name, None)
            if name.startswith("__") or theirs is None or not _callable(member):
                continue
            if not _callable(theirs) or type(member) is not type(theirs):
                continue
            got, expected = _signature(member), _signature(theirs)
            if got is not None and expected is not None and not accepts(got, expected):
                raise InterfaceError(_refusal(f"{owner} ({klass.__name__})", name, got, expected))


def check_wrap_model(wrap: Callable[..., Any] | None, owner: str) -> None:
    """Refuse a ``Method.wrap_model`` that does not take ``(module, spec, params)``."""
    if wrap is None:
        return
    try:
        got = inspect.signature(wrap)
    except (TypeError, ValueError):  # a builtin without a signature: cannot check, let it be
        return
    if not accepts(got, WRAP_MODEL):
        given = getattr(wrap, "__name__", "")
        raise InterfaceError(_refusal(owner, "wrap_model", got, WRAP_MODEL, given))


def _callable(member: Any) -> bool:
    return isinstance(member, (staticmethod, classmethod)) or inspect.isfunction(member)


def _signature(member: Any) -> inspect.Signature | None:
    fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None
