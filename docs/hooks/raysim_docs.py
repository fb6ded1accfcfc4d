"""MkDocs hook for raysim's site (``mkdocs.yml``: ``hooks``).

1. The configuration reference: ``config_reference()`` walks ``raysim.config.RunConfig`` and
   every model nested in it (through ``X | None``, ``list[X]``, ``dict[str, X]``, ``Annotated``
   and unions, discriminated or not: one table per variant) and renders each field's key, type,
   default and description. The registries a config names by ``name``/``kind`` (methods, server
   hooks, client behaviours, delay models) are rendered one variant per registered entry. The
   page ``configuration.md`` holds the prose; this hook appends the tables where it says
   ``<!-- config-reference -->``, so the reference is the schema itself and cannot drift.
2. Pages kept beside their code (``examples/*/RESULTS.md``, ``benchmarks/RESULTS.md``,
   ``cluster/README.md``) are added to the site at build time, with their images, not copied
   into ``docs/``. A docs page links to them by their path in the repository (so the link works
   on GitHub too); the hook points such links at the site's page, and turns links to other
   files outside ``docs/`` (a config, a script) into their plain text.

The generator imports only raysim and pydantic (``tests/test_docs.py`` calls it without MkDocs).
"""

from __future__ import annotations

import inspect
import json
import posixpath
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- config-reference -->"

#: repository file → where the site shows it (its folder's images go along)
INCLUDED = {
    "examples/fedoa/RESULTS.md": "papers/fedoa/results.md",
    "examples/feddle/RESULTS.md": "papers/feddle/results.md",
    "examples/fedbaf/RESULTS.md": "papers/fedbaf/results.md",
    "examples/fedot/RESULTS.md": "papers/fedot/results.md",
    "examples/privacy/RESULTS.md": "privacy/results.md",
    "examples/robust/RESULTS.md": "robustness/results.md",
    "examples/fedprox/RESULTS.md": "devices/fedprox.md",
    "benchmarks/RESULTS.md": "benchmarks/results.md",
    "cluster/README.md": "clusters/guide.md",
    "CHANGELOG.md": "changelog.md",
}
IMAGES = (".png", ".svg", ".jpg")


# --------------------------------------------------------------------- the configuration page


def _families() -> dict[tuple[type, str], tuple[str, bool, Callable[[], dict[str, type]]]]:
    """Fields whose model is picked by a registry, not by the type: (owning model, field) →
    (the key that names the entry, whether its parameters sit flat beside that key, name → the
    entry's params model)."""
    from raysim.sim import delays
    from raysim.algorithms.registry import BEHAVIOURS, MIXERS, method_names, method_spec
    from raysim.config import AlgorithmConfig, ClientHookConfig, RunConfig, ServerHookConfig

    return {
        (AlgorithmConfig, "params"): (
            "name",
            True,
            lambda: {n: method_spec(n).params for n in method_names()},
        ),
        (ServerHookConfig, "params"): (
            "name",
            True,
            lambda: {n: MIXERS.spec(n).params for n in MIXERS.names()},
        ),
        (ClientHookConfig, "params"): (
            "name",
            True,
            lambda: {n: BEHAVIOURS.spec(n).params for n in BEHAVIOURS.names()},
        ),
        (RunConfig, "delays"): (
            "kind",
            False,
            lambda: {k: delays._REGISTRY[k][0] for k in delays.delay_kinds()},
        ),
    }


def _is_model(tp: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _strip_annotated(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def nested_models(tp: Any) -> tuple[str, list[type]]:
    """The models a field's type holds, and the key suffix that reaches them: ``[]`` through a
    list, ``.<key>`` through a dict; ``None`` and non-model members of a union are dropped."""
    tp = _strip_annotated(tp)
    if _is_model(tp):
        return "", [tp]
    if _is_union(tp):
        suffix, found = "", []
        for arg in typing.get_args(tp):
            s, models = nested_models(arg)
            if models:
                suffix = s
                found += [m for m in models if m not in found]
        return suffix, found
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, tuple, set, frozenset) and args:
        s, models = nested_models(args[0])
        return "[]" + s, models
    if origin is dict and len(args) == 2:
        s, models = nested_models(args[1])
        return ".<key>" + s, models
    return "", []


def type_text(tp: Any) -> str:
    """A short, readable type: ``int``, ``"a" or "b"``, ``list[float]``, a model's name."""
    tp = _strip_annotated(tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in typing.get_args(tp))
    if _is_union(tp):
        return " or ".join(type_text(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(type_text(a) for a in typing.get_args(tp))
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{args}]" if args else name
    if _is_model(tp):
        return "section"
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def default_text(field: Any) -> str:
    from pydantic_core import PydanticUndefined, to_jsonable_python

    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    if _is_model(type(value)):
        return "see below"
    try:
        return "`" + json.dumps(to_jsonable_python(value), ensure_ascii=False) + "`"
    except (TypeError, ValueError):
        return f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__")
    if not doc:
        return ""
    return inspect.cleandoc(doc).replace("``", "`")


def _key(name: str, field: Any) -> str:
    return field.alias or name


def _discriminator(field: Any, variants: list[type]) -> str | None:
    """The key that tells a union's variants apart: the field's declared discriminator, else a
    field every variant fixes to one literal value."""
    disc = getattr(field, "discriminator", None)
    if isinstance(disc, str):
        return disc
    common = None
    for v in variants:
        fixed = {
            _key(n, f)
            for n, f in v.model_fields.items()
            if typing.get_origin(_strip_annotated(f.annotation)) is typing.Literal
            and len(typing.get_args(_strip_annotated(f.annotation))) == 1
        }
        common = fixed if common is None else common & fixed
    return sorted(common)[0] if common else None


def _variant_label(cls: type, disc: str | None) -> str:
    if disc:
        for n, f in cls.model_fields.items():
            if _key(n, f) == disc:
                args = typing.get_args(_strip_annotated(f.annotation))
                if typing.get_origin(_strip_annotated(f.annotation)) is typing.Literal:
                    return " or ".join(f"`{disc}: {a}`" for a in args)
                if f.default is not None and not f.is_required():
                    return f"`{disc}: {f.default}`"
    return f"`{cls.__name__}`"


def _heading(level: int, text: str) -> str:
    return "#" * min(level, 6) + " " + text


def render_model(
    cls: type,
    path: str = "",
    level: int = 2,
    title: str | None = None,
    skip: frozenset[str] = frozenset(),
    families: dict | None = None,
) -> list[str]:
    """Markdown lines for ``cls`` at dotted ``path``: a heading, the class docstring, a table of
    its fields, then (recursively) every nested model and every variant of a union."""
    if families is None:
        families = _families()
    out = [_heading(level, title or (f"`{path}`" if path else "Top-level keys")), ""]
    doc = _doc(cls)
    if doc:
        out += [doc, ""]
    rows, children = [], []
    for name, field in cls.model_fields.items():
        key = _key(name, field)
        if key in skip:
            continue
        full = f"{path}.{key}" if path else key
        family = families.get((cls, name))
        if family is not None:
            children.append(("family", full, field, family))
            if family[1]:  # flat beside the name: no key of its own
                continue
        else:
            suffix, models = nested_models(field.annotation)
            if models:
                children.append(("models", full + suffix, field, models))
        rows.append(
            f"| `{full}` | {_cell(type_text(field.annotation))} | {_cell(default_text(field))} "
            f"| {_cell(field.description or '')} |"
        )
    if rows:
        out += ["| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for what, full, field, detail in children:
        if what == "family":
            key, flat, entries = detail
            owner = path if flat else full
            out += _render_family(owner, key, flat, entries(), level + 1, families)
        elif len(detail) == 1:
            out += render_model(detail[0], full, level + 1, families=families)
        else:
            disc = _discriminator(field, detail)
            for variant in detail:
                label = _variant_label(variant, disc)
                out += render_model(
                    variant, full, level + 1, f"`{full}` with {label}", families=families
                )
    return out


def _render_family(
    path: str, key: str, flat: bool, entries: dict[str, type], level: int, families: dict
) -> list[str]:
    """One table per params model of a registry (entries sharing a model share it)."""
    by_model: dict[type, list[str]] = {}
    for name, model in sorted(entries.items()):
        by_model.setdefault(model, []).append(name)
    bare = [n for m, names in by_model.items() if not m.model_fields for n in names]
    out = []
    if bare:
        out += [f"With `{key}` one of {', '.join(f'`{n}`' for n in sorted(bare))}: no "
                "further keys.", ""]  # fmt: skip
    for model, names in by_model.items():
        if not model.model_fields:
            continue
        label = ", ".join(f"`{key}: {n}`" for n in names)
        out += render_model(model, path, level, f"`{path}` with {label}", families=families)
    return out


def config_reference() -> str:
    """The generated part of the configuration page: every key of ``RunConfig``, recursively."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from raysim.config import RunConfig

    return "\n".join(render_model(RunConfig)) + "\n"


# --------------------------------------------------------------------- MkDocs events


def on_config(config, **kwargs):
    # this checkout's raysim, not one an editable install elsewhere points to
    sys.path.insert(0, str(ROOT))
    for name in [m for m in sys.modules if m == "raysim" or m.startswith("raysim.")]:
        del sys.modules[name]
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    for source, dest in INCLUDED.items():
        src = ROOT / source
        files.append(File.generated(config, dest, abs_src_path=str(src)))
        for image in sorted(src.parent.iterdir()):
            if image.suffix in IMAGES:
                uri = posixpath.join(posixpath.dirname(dest), image.name)
                files.append(File.generated(config, uri, abs_src_path=str(image)))
    return files


_LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")


def _rewrite_links(markdown: str, repo_page: str, page_src: str, docs_dir: Path) -> str:
    """Links that leave ``docs/`` (written relative to the page's place in the repository,
    ``repo_page``, so that they work on GitHub): to a docs page → its path from the site's page
    ``page_src``; to an included page → that page; to any other file → the link's text."""
    here = (ROOT / repo_page).parent
    docs = docs_dir.resolve()

    def fix(m: re.Match) -> str:
        bang, text, target = m.groups()
        if bang or re.match(r"^[a-z]+:|^#|^/", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        resolved = (here / path).resolve()
        if resolved.is_relative_to(docs):
            uri = resolved.relative_to(docs).as_posix()
        elif resolved.is_relative_to(ROOT) and resolved.relative_to(ROOT).as_posix() in INCLUDED:
            uri = INCLUDED[resolved.relative_to(ROOT).as_posix()]
        else:
            return text
        rel = posixpath.relpath(uri, posixpath.dirname(page_src) or ".")
        return f"[{text}]({rel}{'#' + anchor if anchor else ''})"

    return _LINK.sub(fix, markdown)


def on_page_markdown(markdown, page, config, files, **kwargs):
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, config_reference())
    src = page.file.src_uri
    docs_dir = Path(config["docs_dir"])
    repo_page = {v: k for k, v in INCLUDED.items()}.get(src)
    if repo_page is None:
        repo_page = (docs_dir / src).resolve().relative_to(ROOT).as_posix()
    return _rewrite_links(markdown, repo_page, src, docs_dir)
