"""``raysim extract``: FedBaF's extraction harness (E0/E1/E2) against a run with observers."""

from __future__ import annotations

import argparse

from rich.table import Table

from raysim.cli.common import console, error


def cmd_extract(args: argparse.Namespace) -> int:
    from raysim.security.report import extract
    from raysim.tracking.store import default_tracking_uri

    uri = args.uri or default_tracking_uri()
    noise = tuple(float(e) for e in args.noise.split(",")) if args.noise else None
    try:
        with console.status("replaying the observers' rounds and running E0/E1/E2"):
            out = extract(
                args.run,
                uri,
                args.observations,
                args.foundation,
                noise,
                log=True,
                trust_modules=args.trust_modules,
            )
    except (ValueError, FileNotFoundError) as e:  # no such run, no observers, not FedBaF
        return error(str(e))
    table = Table(title="extraction of the foundation (matched layers)")
    for col in ("attack", "estimates", "best rel. error", "median rel. error", "cosine", "CKA"):
        table.add_column(col)
    for key in sorted(
        {
            k.rsplit("_relative_error_min", 1)[0]
            for k in out.summary
            if k.endswith("_relative_error_min")
        }
    ):
        s = out.summary
        table.add_row(
            key.replace("_", " "),
            f"{s[f'{key}_count']:.0f}",
            f"{s[f'{key}_relative_error_min']:.3g}",
            f"{s[f'{key}_relative_error_median']:.3g}",
            f"{s[f'{key}_cosine_best']:.6f}",
            f"{s.get(f'{key}_cka_best', float('nan')):.4f}",
        )
    console.print(table)
    if out.noise:
        console.print(
            "noise sweep (source-task accuracy): "
            + ", ".join(f"{r['mode']} e={r['error_rate']:g} {r['accuracy']:.3f}" for r in out.noise)
        )
    console.print(f"logged as MLflow run {out.run_id} (extraction.csv, extraction.png)")
    return 0
