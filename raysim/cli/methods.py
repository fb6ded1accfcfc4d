"""``raysim methods``: the registered methods, or one method's parameters; ``--module`` imports a
user's module first, so that the methods it registers are listed too."""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from raysim.cli.common import console


def cmd_methods(args: argparse.Namespace) -> int:
    """``raysim methods``: every method, what it needs, whether it batches and its parameters'
    names; ``raysim methods NAME``: one method whole (each parameter's type, default and meaning,
    how its updates reach the server: ``workers.partial_sums``). ``--module MODULE`` (repeatable)
    imports a user's module first, as ``algorithm.module`` does in a run."""
    from raysim.algorithms.interface import INTERFACE_VERSION
    from raysim.algorithms.registry import get_method, load_plugin, method_names
    from raysim.config import ConfigError

    for module in getattr(args, "module", None) or ():
        load_plugin(module)  # a PluginError is the user's: one line, exit 2
    if args.name:
        try:
            m = get_method(args.name)
        except KeyError as e:
            hint = (
                ""
                if getattr(args, "module", None)
                else "; a method of your own module: raysim methods NAME --module MODULE"
            )
            raise ConfigError(str(e).strip("\"'") + hint) from None
        console.print(f"{m.name}: {m.reference}", soft_wrap=True, markup=False)
        console.print(f"needs: {m.needs.describe()}; clients: {m.batching}", markup=False)
        console.print(f"updates: {m.spec.updates}", soft_wrap=True, markup=False)
        fields = m.params.model_fields.items()
        if not fields:
            console.print("parameters: none")
            return 0
        table = Table(
            box=box.SIMPLE_HEAD,
            title="parameters (algorithm.NAME=VALUE)",
            title_justify="left",
            pad_edge=False,
        )
        table.add_column("name", no_wrap=True)
        table.add_column("default", overflow="fold")
        table.add_column("type: meaning", ratio=1)
        for key, f in fields:
            default = "(required)" if f.is_required() else f.get_default(call_default_factory=True)
            about = Text(type_name(f.annotation), style="cyan")
            if f.description:  # may be unset: the type alone
                about.append(f": {f.description}")
            table.add_row(Text(f.alias or key), Text(str(default)), about)
        console.print(table)
        return 0
    table = Table(
        title=f"registered methods (method interface {INTERFACE_VERSION}, CHANGELOG.md)",
        caption="raysim methods NAME: one method whole; --module MODULE: yours too",
    )
    table.add_column("name", no_wrap=True)
    table.add_column("needs")
    table.add_column("batched")
    table.add_column("parameters", overflow="fold")
    for name in method_names():
        m = get_method(name)
        params = " ".join(f.alias or k for k, f in m.params.model_fields.items())
        table.add_row(name, m.needs.describe(), m.batching, params or "—")
    console.print(table)
    return 0


def type_name(annotation: Any) -> str:
    """A parameter's type as a config's writer reads it: ``float``, ``int | None``, the choices of
    a ``Literal`` (``l2 | cosine``), ``list[str]``."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin is None and isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")
