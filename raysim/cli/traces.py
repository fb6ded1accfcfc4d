"""``raysim traces``: device traces in raysim's own format (docs/devices.md), from FedScale's
pickled files or from the seeded generator, and a summary of what they hold."""

from __future__ import annotations

import argparse

from rich.table import Table

from raysim.cli.common import console, error


def cmd_traces(args: argparse.Namespace) -> int:
    import numpy as np

    from raysim.devices.traces import TraceError, read_traces, write_traces

    try:
        if args.fedscale:
            from raysim.devices.fedscale import read_fedscale

            traces = read_fedscale(args.fedscale, args.availability)
        elif args.synthetic:
            from raysim.devices.synthetic import synthetic_traces

            traces = synthetic_traces(args.synthetic, args.seed)
        else:
            traces = read_traces(args.folder)
    except TraceError as e:
        return error(str(e))
    if args.out:
        write_traces(traces, args.out, args.format)
        console.print(f"wrote {traces.size} devices to {args.out} ({args.format})")
    table = Table(title="device traces")
    for col in ("devices", "compute ms/sample (median)", "bandwidth kbit/s (median)",
                "share of time available"):  # fmt: skip
        table.add_column(col)
    table.add_row(
        f"{traces.size:,}",
        f"{float(np.median(traces.compute_ms)):.1f}",
        f"{float(np.median(traces.bandwidth_kbps)):.0f}",
        f"{traces.fraction_available():.1%}",
    )
    console.print(table)
    return 0
