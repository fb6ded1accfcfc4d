"""``raysim loto`` and ``raysim lodo``: leave one task family (or text domain) out, for every
held-out setting and method."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from raysim.cli.common import console


def cmd_leave_one_out(args: argparse.Namespace) -> int:
    """Leave-one-task-out (``loto``) or leave-one-domain-out (``lodo``): every held-out setting ×
    method, one MLflow parent run."""
    from raysim.sweeps.protocols import TASK_FAMILIES, leave_one_out

    overrides = list(args.overrides)
    if args.command == "lodo":
        key, default, name = "data.text.held_out_domain", ["d1", "d2"], "leave-one-domain-out"
        # one client per remaining sub-dataset (4 families) × shards
        from raysim.config import ConfigError, load_config

        data = load_config(args.config, overrides).data
        text = getattr(data, "text", None)
        if text is None:
            raise ConfigError(f"lodo leaves text domains out: data.name={data.name!r} has none")
        shards = text.shards_per_task
        overrides = [
            "data.text.protocol=domain",
            f"clients.num={4 * shards}",
            f"clients.per_round={4 * shards}",
            *overrides,
        ]
    else:
        key, default, name = "data.text.held_out", list(TASK_FAMILIES), "leave-one-task-out"
    settings = args.held_out.split(",") if args.held_out else default
    methods = args.methods.split(",")
    total = len(settings) * len(methods)
    done = 0

    def on_run(setting: str, method: str, res: Any) -> None:
        nonlocal done
        done += 1
        value = res.metrics.get(args.metric, float("nan"))
        console.print(f"[{done}/{total}] held out {setting} · {method}: {args.metric}={value:.3f}")

    out = leave_one_out(
        args.config,
        overrides,
        key=key,
        settings=settings,
        methods=methods,
        metric=args.metric,
        name=name,
        address=args.address,
        on_run=on_run,
        dry_run=args.dry_run,
    )
    if args.dry_run:
        console.print(f"dry run: {name}: {total} runs validated; nothing started", markup=False)
        return 0
    table = Table(title=f"{name} · {args.metric} (parent run {out.parent_run_id})")
    table.add_column("method")
    for col in [*out.settings, "Average"]:
        table.add_column(col, justify="right")
    for m in out.methods:
        cells = [f"{out.table[m][s]:.2f}" for s in out.settings]
        table.add_row(m, *cells, f"{out.average(m):.2f}")
    console.print(table)
    return 0
