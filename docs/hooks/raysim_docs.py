"""MkDocs hook for raysim's site (``mkdocs.yml``: ``hooks``).

1. The configuration reference: ``config_reference()`` walks ``raysim.config.RunConfig`` and
   every model nested in it (through ``X | None``, ``list[X]``, ``dict[str, X]``, ``Annotated``
   and unions, discriminated or not: one table per variant) and renders each field's key, type,
   default and description (``Field(description=...)``). The registries a config names by
   ``name``/``kind`` (methods, server hooks, client behaviours, delay models) are rendered one
   variant per registered entry, and the names they hold (with the data sources and the models)
   are listed from the registries (``_choices``). Nothing is repeated: fields that several
   variants inherit from one base are one table ("keys of every ``name``"), and a section that
   fields of several models hold (``data.hf_image``) is rendered once, linked from each
   (``shared_sections``). The page ``configuration.md`` holds the prose; this hook appends the
   tables where it says ``<!-- config-reference -->``, so the reference is the schema itself and
   cannot drift.
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
    from raysim.algorithms.registry import BEHAVIOURS, MIXERS, method_names, method_spec
    from raysim.config import AlgorithmConfig, ClientHookConfig, RunConfig, ServerHookConfig
    from raysim.sim import delays

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


def _references() -> dict[tuple[type, str], Callable[[str], str]]:
    """For a registry's entries: name → the reference its spec gives (paper, spec section)."""
    from raysim.algorithms.registry import BEHAVIOURS, MIXERS, method_spec
    from raysim.config import AlgorithmConfig, ClientHookConfig, ServerHookConfig

    return {
        (AlgorithmConfig, "params"): lambda n: method_spec(n).reference,
        (ServerHookConfig, "params"): lambda n: MIXERS.spec(n).reference,
        (ClientHookConfig, "params"): lambda n: BEHAVIOURS.spec(n).reference,
    }


def _choices() -> dict[tuple[type, str], tuple[str, Callable[[], list[str]]]]:
    """Keys whose values a registry holds (a bare ``str`` checked elsewhere, or the name or kind
    that picks a section): (owning model, field) → (the key below the field that takes the
    values, "" for the field itself; the registry's names). The page lists them from here."""
    from raysim.algorithms.registry import BEHAVIOURS, MIXERS, method_names
    from raysim.config import AlgorithmConfig, ClientHookConfig, RunConfig, ServerHookConfig
    from raysim.data.federated import SOURCE_NAMES
    from raysim.models.registry import ModelConfig, model_names
    from raysim.sim.delays import delay_kinds

    return {
        (RunConfig, "data"): ("name", lambda: list(SOURCE_NAMES)),
        (ModelConfig, "name"): ("", model_names),
        (AlgorithmConfig, "name"): ("", method_names),
        (ServerHookConfig, "name"): ("", MIXERS.names),
        (ClientHookConfig, "name"): ("", BEHAVIOURS.names),
        (RunConfig, "delays"): ("kind", delay_kinds),
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
    """A short, readable type: ``int``, ``"a" or "b"``, ``list[float]``, ``section``."""
    tp = _strip_annotated(tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in typing.get_args(tp))
    if _is_union(tp):  # a union of sections is one "section"
        return " or ".join(dict.fromkeys(type_text(a) for a in typing.get_args(tp)))
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


def _literal_values(field: Any) -> set | None:
    tp = _strip_annotated(field.annotation)
    return set(typing.get_args(tp)) if typing.get_origin(tp) is typing.Literal else None


def _discriminator(field: Any, variants: list[type]) -> str | None:
    """The key that tells a union's variants apart: the field's declared discriminator, else a
    key that every variant fixes to literal values no other variant takes."""
    disc = getattr(field, "discriminator", None)
    if isinstance(disc, str):
        return disc
    common: dict[str, list[set]] | None = None
    for v in variants:
        fixed = {_key(n, f): _literal_values(f) for n, f in v.model_fields.items()}
        fixed = {k: [s] for k, s in fixed.items() if s}
        common = (
            fixed if common is None else {k: common[k] + fixed[k] for k in common if k in fixed}
        )
    for key in sorted(common or {}):
        sets = common[key]
        if sum(len(s) for s in sets) == len(set().union(*sets)):  # pairwise disjoint
            return key
    return None


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


def _top(path: str) -> str:
    """The top-level key a dotted path starts with."""
    return re.split(r"[.\[]", path, maxsplit=1)[0]


class _Page:
    """What one rendering of the reference shares: the registries, the sections rendered once
    (``shared``: model → where it occurs, as (key path, title of the table holding it)), and
    every nested section met on the way (``seen``: (model, owner, field, path, owner's title))."""

    def __init__(
        self,
        families: dict,
        choices: dict | None = None,
        references: dict | None = None,
        shared: dict[type, list[tuple[str, str]]] | None = None,
    ) -> None:
        self.families = families
        self.choices = choices or {}
        self.references = references or {}
        self.shared = shared or {}
        self.seen: list[tuple[type, type, str, str, str]] = []
        self.documented: set[type] = set()  # bases of common keys whose docstring is shown
        self.listed: list[tuple[str, list[str]]] = []  # (key, the registry's names) on the page

    def canonical(self, model: type) -> str:
        """The path a shared section's keys are written under: its shortest."""
        paths = list(dict.fromkeys(p for p, _ in self.shared[model]))
        return min(paths, key=lambda p: (p.count(".") + p.count("["), paths.index(p)))

    def anchor(self, model: type) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.canonical(model).lower()).strip("-")


def shared_sections(page: _Page) -> dict[type, list[tuple[str, str]]]:
    """The nested sections that fields of more than one model hold (``data.partition`` under
    every pooled data source), from ``page.seen``: each is rendered once and linked to."""
    owners: dict[type, set[tuple[type, str]]] = {}
    places: dict[type, list[tuple[str, str]]] = {}
    for model, owner, name, path, where in page.seen:
        owners.setdefault(model, set()).add((owner, name))
        places.setdefault(model, [])
        if (path, where) not in places[model]:
            places[model].append((path, where))
    return {m: places[m] for m in places if len(owners[m]) > 1}


def render_model(
    cls: type,
    path: str = "",
    level: int = 2,
    title: str | None = None,
    skip: frozenset[str] = frozenset(),
    families: dict | None = None,
    page: _Page | None = None,
) -> list[str]:
    """Markdown lines for ``cls`` at dotted ``path``: a heading, the class docstring, a table of
    its fields, then (recursively) every nested model and every variant of a union. A model in
    ``page.shared`` is not rendered below its field but linked to (``reference`` renders it
    once)."""
    if page is None:
        page = _Page(_families() if families is None else families, _choices(), _references())
    heading = title or (f"`{path}`" if path else "Top-level keys")
    return [_heading(level, heading), ""] + _body(cls, path, level, heading, skip, page)


def _sentences(parts: list[str]) -> str:
    """A field's description and what the page adds to it (its choices, a link), as sentences."""
    parts = [p.strip() for p in parts if p and p.strip()]
    return " ".join(
        p if p[-1] in ".!?" or i == len(parts) - 1 else p + "." for i, p in enumerate(parts)
    )


def _choice_text(page: _Page, cls: type, name: str, full: str) -> str:
    entry = page.choices.get((cls, name))
    if entry is None:
        return ""
    sub, registry = entry
    key, names = (f"{full}.{sub}" if sub else full), list(registry())
    if (key, names) not in page.listed:
        page.listed.append((key, names))
    return f"`{key}` is one of: " + ", ".join(f"`{n}`" for n in names) + "."


def _body(
    cls: type,
    path: str,
    level: int,
    heading: str,
    skip: frozenset[str],
    page: _Page,
    intro: tuple[str, ...] = (),
    doc: bool = True,
    also: tuple[str, ...] = (),
) -> list[str]:
    out = [" ".join(intro), ""] if intro else []
    text = _doc(cls) if doc else ""
    if text:
        out += [text, ""]
    if also:
        out += [" ".join(also), ""]
    rows, children = [], []
    for name, field_info in cls.model_fields.items():
        key = _key(name, field_info)
        if key in skip:
            continue
        full = f"{path}.{key}" if path else key
        meaning = [field_info.description or ""]
        family = page.families.get((cls, name))
        if family is not None:
            children.append(
                ("family", full, field_info, (*family, page.references.get((cls, name))))
            )
            if family[1]:  # flat beside the name: no key of its own
                continue
        else:
            suffix, models = nested_models(field_info.annotation)
            if models:
                children.append(("models", full + suffix, field_info, models))
                if len(models) == 1:
                    page.seen.append((models[0], cls, name, full + suffix, heading))
                    if models[0] in page.shared:
                        target = page.canonical(models[0])
                        meaning.append(f"Its keys: [`{target}`](#{page.anchor(models[0])}).")
        meaning.append(_choice_text(page, cls, name, full))
        rows.append(
            f"| `{full}` | {_cell(type_text(field_info.annotation))} "
            f"| {_cell(default_text(field_info))} | {_cell(_sentences(meaning))} |"
        )
    if rows:
        out += ["| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    chunks: list[tuple[str, list[str]]] = []
    for what, full, field_info, detail in children:
        if what == "family":
            key, flat, entries, about = detail
            owner = path if flat else full
            lines = _render_family(owner, key, flat, entries(), level + 1, page, about)
        elif len(detail) == 1:
            if detail[0] in page.shared:
                continue  # rendered once, where _place_shared puts it
            lines = render_model(detail[0], full, level + 1, page=page)
        else:
            disc = _discriminator(field_info, detail)
            items = [(_variant_label(v, disc), _variant_names(v, disc), v, ()) for v in detail]
            lines = _render_siblings(full, disc or "type", items, level + 1, page)
        chunks.append((_top(full), lines))
    if not path:  # the top: each shared section after the last section of its top-level key
        chunks = _place_shared(chunks, level + 1, page)
    return out + [line for _, lines in chunks for line in lines]


def _place_shared(
    chunks: list[tuple[str, list[str]]], level: int, page: _Page
) -> list[tuple[str, list[str]]]:
    """The top's sections (top-level key, lines) with each shared section after the last one of
    the top-level key all its places are under (``data.hf_image`` after the data sources), or
    at the end."""
    after: dict[int, list[type]] = {}
    for model, places in page.shared.items():
        tops = {_top(p) for p, _ in places}
        last = [i for i, (top, _) in enumerate(chunks) if top in tops]
        at = last[-1] if len(tops) == 1 and last else len(chunks) - 1
        after.setdefault(at, []).append(model)
    out = []
    for i, chunk in enumerate(chunks):
        out.append(chunk)
        for model in after.get(i, []):
            out.append(("", _render_shared(model, level, page)))
    return out


def _render_shared(model: type, level: int, page: _Page) -> list[str]:
    """A section that several models hold, once: where it occurs, then its keys."""
    canonical = page.canonical(model)
    where = list(dict.fromkeys(w for _, w in page.shared[model]))
    where = ["the top-level keys" if w == "Top-level keys" else w for w in where]
    intro = [f"Held by {', '.join(where)}: listed once here, linked from each."]
    others = [p for p in dict.fromkeys(p for p, _ in page.shared[model]) if p != canonical]
    if others:
        intro.append(
            "The keys are written under `"
            + canonical
            + "`; under "
            + ", ".join(f"`{p}`" for p in others)
            + " they are the same, after that prefix."
        )
    heading = f"`{canonical}`"
    return [_heading(level, f"{heading} {{#{page.anchor(model)}}}"), ""] + _body(
        model, canonical, level, heading, frozenset(), page, (" ".join(intro),)
    )


def _render_family(
    path: str,
    key: str,
    flat: bool,
    entries: dict[str, type],
    level: int,
    page: _Page,
    about: Callable[[str], str] | None = None,
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
    items = []
    for model, names in by_model.items():
        if not model.model_fields:
            continue
        label = ", ".join(f"`{key}: {n}`" for n in names)
        refs = tuple(f"`{n}`: {about(n)}." for n in names if about is not None and about(n))
        items.append((label, names, model, refs))
    return out + _render_siblings(path, key, items, level, page)


def _variant_names(cls: type, disc: str | None) -> list[str]:
    for n, f in cls.model_fields.items():
        if disc and _key(n, f) == disc and _literal_values(f):
            return [str(a) for a in typing.get_args(_strip_annotated(f.annotation))]
    return [cls.__name__]


def _owner(cls: type, name: str) -> type:
    """The class that declares field ``name`` of ``cls`` (itself, or the base it inherits from)."""
    return next((c for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {})), cls)


def _render_siblings(
    path: str,
    key: str,
    items: list[tuple[str, list[str], type, tuple[str, ...]]],
    level: int,
    page: _Page,
) -> list[str]:
    """The tables of the models one key picks among at ``path`` (a union's variants, a
    registry's entries): items are (label, the names that pick it, model, intro lines). Fields
    that several of them inherit unchanged from one base are one table of their own ("keys of
    every ``name``"), which each model's table links to instead of repeating them."""
    users: dict[tuple[type, str], list[int]] = {}
    for i, (_, _, model, _) in enumerate(items):
        for name in model.model_fields:
            users.setdefault((_owner(model, name), name), []).append(i)
    common: dict[tuple[type, tuple[int, ...]], list[str]] = {}  # (base, takers) → fields
    for (base, name), who in users.items():
        if len(who) > 1:
            common.setdefault((base, tuple(who)), []).append(name)
    out: list[str] = []
    links: dict[int, list[str]] = {}
    skips: dict[int, set[str]] = {}
    own = [m for _, _, m, _ in items]
    for n_group, ((base, takers), fields) in enumerate(common.items()):
        if len(takers) == len(items):
            heading = f"`{path}`: keys of every `{key}`"
        else:
            names = [n for i in takers for n in items[i][1]]
            heading = f"`{path}`: keys of `{key}` " + ", ".join(f"`{n}`" for n in names)
        anchor = re.sub(r"[^a-z0-9]+", "-", f"{path} keys {n_group + 1}".lower()).strip("-")
        keys = [_key(n, f) for n, f in base.model_fields.items() if n in fields]
        out += [_heading(level, f"{heading} {{#{anchor}}}"), ""]
        out += _body(
            base,
            path,
            level,
            heading,
            frozenset(_key(n, f) for n, f in base.model_fields.items() if n not in fields),
            page,
            doc=base not in own and base not in page.documented,  # its docstring once
        )
        page.documented.add(base)
        for i in takers:
            links.setdefault(i, []).append(f"[{', '.join(f'`{k}`' for k in keys)}](#{anchor})")
            skips.setdefault(i, set()).update(keys)
    for i, (label, _, model, intro) in enumerate(items):
        heading = f"`{path}` with {label}"
        also = links.get(i, [])
        also = (f"Also takes {', '.join(also)}.",) if also else ()
        out += [_heading(level, heading), ""]
        out += _body(
            model, path, level, heading, frozenset(skips.get(i, ())), page, intro, also=also
        )
    return out


def reference(
    root: type,
    families: dict | None = None,
    choices: dict | None = None,
    references: dict | None = None,
) -> str:
    """Every key of the model ``root``, recursively (``render_model``), with each section that
    several models hold rendered once and linked to from each (``shared_sections``): a first
    pass finds them, the second renders. Registries default to raysim's (``_families`` etc.)."""
    page = _Page(
        _families() if families is None else families,
        _choices() if choices is None else choices,
        _references() if references is None else references,
    )
    render_model(root, page=page)
    page = _Page(page.families, page.choices, page.references, shared_sections(page))
    lines = render_model(root, page=page)
    return "\n".join(_choices_table(page) + lines) + "\n"


def _choices_table(page: _Page) -> list[str]:
    """The names the registries hold, for the keys that name a registry's entry."""
    rows = [
        f"| `{key}` | " + ", ".join(f"`{n}`" for n in names) + " |" for key, names in page.listed
    ]
    if not rows:
        return []
    return ["## Choices", "", "The names that pick a data source, a model, a method, a hook "
            "and a delay model, read from their registries.", "",
            "| key | one of |", "|---|---|", *rows, ""]  # fmt: skip


def config_reference() -> str:
    """The generated part of the configuration page: every key of ``RunConfig``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from raysim.config import RunConfig

    return reference(RunConfig)


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


_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


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
