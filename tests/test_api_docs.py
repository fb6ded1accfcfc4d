"""The API reference covers what a plugin author touches: every public name of the interface
modules has a docstring (mkdocstrings shows no member without one), and every name
``docs/adding-a-method.md``'s examples import from raysim is rendered by a ``:::`` block of
``docs/api/``.

Read from the source (``ast``), as the site's renderer (griffe) reads it: a function's or class's
docstring, and for an attribute (a module constant, a dataclass field, a class attribute, a
``self.x`` set in ``__init__``) the string literal right below its assignment. A ``#:`` comment
is not rendered, so it does not count; a pydantic field's ``Field(description=...)`` does (the
configuration reference shows it).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.conftest import ROOT

#: The interface modules: module → the names a plugin author uses (None: every public name)
INTERFACE: dict[str, tuple[str, ...] | None] = {
    "raysim.algorithms.interface": None,
    "raysim.algorithms.base": None,
    "raysim.algorithms.spec": None,
    "raysim.algorithms.registry": None,
    "raysim.algorithms.hooks": None,
    "raysim.algorithms.context": None,
    "raysim.algorithms.private": None,
    "raysim.algorithms.exact_sum": ("HeldDelta",),
    "raysim.models.layout": None,
    "raysim.models.handle": None,
    "raysim.training.loop": None,
    "raysim.training.tasks": ("Task",),
    "raysim.launch.session": ("Result",),
    "raysim.errors": ("Diverged",),
}
#: pydantic's configuration of a params model: no API of its own
NOT_API = {"model_config"}
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))
EXAMPLE = ROOT / "docs" / "adding-a-method.md"


def source(module: str) -> Path:
    return Path(importlib.util.find_spec(module).origin)


def public(name: str) -> bool:
    return not name.startswith("_") and name not in NOT_API


def _targets(node: ast.stmt) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        out = []
        for t in node.targets:
            out += t.elts if isinstance(t, ast.Tuple) else [t]
        return out
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def _is_typevar(node: ast.stmt) -> bool:
    value = getattr(node, "value", None)
    return isinstance(value, ast.Call) and getattr(value.func, "id", "") == "TypeVar"


def _described(node: ast.stmt) -> bool:
    """A pydantic field with a description: ``x: int = Field(..., description="...")``."""
    value = getattr(node, "value", None)
    return (
        isinstance(value, ast.Call)
        and getattr(value.func, "id", "") == "Field"
        and any(k.arg == "description" for k in value.keywords)
    )


def _attributes(body: list[ast.stmt], self_only: bool) -> Iterator[tuple[str, bool]]:
    """(name, documented) of every attribute assigned in ``body``: names (``self.x`` where
    ``self_only``), documented by a string literal on the next statement."""
    for i, node in enumerate(body):
        following = body[i + 1] if i + 1 < len(body) else None
        documented = _described(node) or (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        )
        for t in _targets(node):
            if self_only and isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "self":
                yield t.attr, documented
            elif not self_only and isinstance(t, ast.Name) and not _is_typevar(node):
                yield t.id, documented


def _is_setter(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr == "setter" for d in fn.decorator_list)


def _class_members(cls: ast.ClassDef, prefix: str) -> Iterator[tuple[str, bool]]:
    """A class's public methods, properties, nested classes and attributes (those of its body
    and the ``self.x`` of its ``__init__``; one name documented in either place is)."""
    attributes: dict[str, bool] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == "__init__":
                for name, documented in _attributes(node.body, self_only=True):
                    attributes[name] = attributes.get(name, False) or documented
            elif public(node.name) and not _is_setter(node):
                yield f"{prefix}.{node.name}", ast.get_docstring(node) is not None
        elif isinstance(node, ast.ClassDef) and public(node.name):
            yield f"{prefix}.{node.name}", ast.get_docstring(node) is not None
            yield from _class_members(node, f"{prefix}.{node.name}")
    for name, documented in _attributes(cls.body, self_only=False):
        attributes[name] = attributes.get(name, False) or documented
    methods = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for name, documented in attributes.items():
        if public(name) and name not in methods:  # a property's setter assigns its own name
            yield f"{prefix}.{name}", documented


def definitions(module: str, names: tuple[str, ...] | None) -> Iterator[tuple[str, bool]]:
    """(qualified name, documented) of every public definition of ``module`` (its functions,
    classes, constants, and each class's public methods, properties and attributes), or of the
    listed names only."""
    body = ast.parse(source(module).read_text()).body
    wanted = (lambda n: n in names) if names is not None else public
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if wanted(node.name):
                yield f"{module}.{node.name}", ast.get_docstring(node) is not None
                if isinstance(node, ast.ClassDef):
                    yield from _class_members(node, f"{module}.{node.name}")
    for name, documented in _attributes(body, self_only=False):
        if wanted(name) and name != "__all__":
            yield f"{module}.{name}", documented


def all_definitions() -> list[tuple[str, bool]]:
    return [d for module, names in INTERFACE.items() for d in definitions(module, names)]


def test_every_public_name_of_the_interface_modules_has_a_docstring():
    found = all_definitions()
    assert len(found) > 250, len(found)  # the walk finds them (methods, fields, constants)
    listed = {q for q, _ in found}
    for module, names in INTERFACE.items():  # a listed name that moved away fails here
        for name in names or ():
            assert f"{module}.{name}" in listed, f"{module} defines no {name}"
    missing = [q for q, documented in found if not documented]
    assert not missing, "no docstring (so not in the API reference): " + ", ".join(missing)


def rendered() -> dict[str, set[str] | None]:
    """What the ``:::`` blocks of ``docs/api/`` render: identifier → its ``members`` option
    (None: every documented public member)."""
    out: dict[str, set[str] | None] = {}
    for page in API_PAGES:
        text = page.read_text()
        for m in re.finditer(r"^::: ([\w.]+)\n((?:[ \t]+.*\n?)*)", text, flags=re.M):
            options = (yaml.safe_load(m.group(2)) or {}).get("options", {}) if m.group(2) else {}
            members = options.get("members")
            out[m.group(1)] = None if members in (None, True) else set(members)
    return out


def example_imports() -> list[tuple[str, str]]:
    """(module, name) of every ``from raysim... import name`` in the page's Python blocks."""
    out = []
    for block in re.findall(r"```python\n(.*?)```", EXAMPLE.read_text(), flags=re.S):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raysim"):
                out += [(node.module, a.name) for a in node.names]
    return out


def home(module: str, name: str) -> str:
    """The module that defines ``module.name`` (a package's lazy export resolved)."""
    obj = getattr(importlib.import_module(module), name)
    defined = getattr(obj, "__module__", None)
    return defined if isinstance(defined, str) and defined.startswith("raysim") else module


def test_every_name_the_example_imports_is_in_the_api_reference():
    imports = example_imports()
    assert {n for _, n in imports} >= {"ClientAlgorithm", "register", "train_local", "SHARED"}
    blocks = rendered()
    documented = dict(all_definitions())
    for module, name in imports:
        where = home(module, name)
        assert where in INTERFACE, f"{name} lives in {where}, which is no interface module"
        assert documented.get(f"{where}.{name}"), f"{where}.{name} has no docstring"
        shown = f"{where}.{name}" in blocks or (
            where in blocks and (blocks[where] is None or name in blocks[where])
        )
        assert shown, f"no ::: block of docs/api/ renders {where}.{name}"


def test_plugin_facing_members_are_documented():
    """The ones the issue named, spelled out: a rename cannot drop them from the check."""
    documented = dict(all_definitions())
    for q in (
        "raysim.algorithms.base.ClientAlgorithm.train",
        "raysim.algorithms.base.Update.delta",
        "raysim.algorithms.context.ServerContext",
        "raysim.algorithms.context.ServerContext.layout",
        "raysim.training.loop.train_local",
        "raysim.models.handle.ModelHandle",
        "raysim.models.handle.ModelHandle.global_parameters",
        "raysim.launch.session.Result.metrics",
        "raysim.models.layout.Layout.mask",
    ):
        assert documented.get(q), q
