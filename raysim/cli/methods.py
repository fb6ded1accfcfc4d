"""``raysim methods``: the registered methods, or one method's parameters."""

from __future__ import annotations

import argparse

from rich.table import Table

from raysim.cli.common import console


def cmd_methods(args: argparse.Namespace) -> int:
    """``raysim methods``: every method, what it needs, whether it batches and its parameters'
    names; ``raysim methods NAME``: one method whole (each parameter's default and meaning, how
    its updates reach the server: ``workers.partial_sums``)."""
    from raysim.algorithms.interface import INTERFACE_VERSION
    from raysim.algorithms.registry import get_method, method_names
    from raysim.config import ConfigError

    if args.name:
        try:
            m = get_method(args.name)
        except KeyError as e:
            raise ConfigError(str(e).strip("\"'")) from None
        console.print(f"{m.name}: {m.reference}", soft_wrap=True, markup=False)
        console.print(f"needs: {m.needs.describe()}; clients: {m.batching}", markup=False)
        console.print(f"updates: {m.spec.updates}", soft_wrap=True, markup=False)
        fields = m.params.model_fields.items()
        console.print("parameters (algorithm.NAME=VALUE):" if fields else "parameters: none")
        for key, f in fields:
            default = "(required)" if f.is_required() else f.get_default(call_default_factory=True)
            about = f" : {f.description}" if f.description else ""
            console.print(f"  {f.alias or key} = {default}{about}", soft_wrap=True, markup=False)
        return 0
    table = Table(
        title=f"registered methods (method interface {INTERFACE_VERSION}, CHANGELOG.md)",
        caption="raysim methods NAME: one method whole",
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
