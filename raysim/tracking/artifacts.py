"""A run's tables and plots: CSVs of clients and rows, learning curves."""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("raysim")


def rows_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """A CSV of ``rows``; its columns are every key of any row, in order of first appearance
    (a personalised run's clients that never reported yet have no scores: empty cells)."""
    if not rows:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def write_clients_csv(
    path: Path, rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None
) -> None:
    """The per-client table, row by row under ``columns`` (default: every key of any row)."""
    if columns is None:
        rows = list(rows)
        columns = list(dict.fromkeys(k for r in rows for k in r))
    write_rows_csv(path, rows, columns)


def write_rows_csv(path: Path, rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """``rows`` written one by one under ``columns`` (none is held once written: 10^6 clients'
    rows); a key a row lacks is an empty cell."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), restval="")
        writer.writeheader()
        writer.writerows(rows)


def _import_plotting() -> Any:
    """matplotlib's pyplot, drawing to files only (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(history: Sequence[Mapping[str, float]], path: Path) -> None:
    """Accuracy (and loss) of the global model against virtual time."""
    plt = _import_plotting()

    evals = [h for h in history if "accuracy" in h]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if evals:
        t = [h["virtual_time"] for h in evals]
        ax.plot(t, [h["accuracy"] for h in evals], marker=".", label="accuracy")
        ax.set_ylim(0, 1)
        if any("loss" in h for h in evals):
            ax2 = ax.twinx()
            ax2.plot(t, [h.get("loss", np.nan) for h in evals], color="tab:red", alpha=0.5)
            ax2.set_ylabel("test loss", color="tab:red")
    ax.set_xlabel("virtual time (rounds)")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
