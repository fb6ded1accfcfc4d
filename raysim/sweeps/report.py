"""What a sweep leaves in its parent MLflow run: the trial table (CSV and Markdown), the best
config as YAML, the metric against each swept key, and every trial's learning curve."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import yaml


def table_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def table_markdown(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols = [c for c in rows[0] if c != "weights_digest"]

    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_report(out: Path, summary: Any, grid: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, rows = summary.metric, summary.table
    (out / "trials.csv").write_text(table_csv(rows))
    (out / "trials.md").write_text(table_markdown(rows))
    (out / "best_config.yaml").write_text(yaml.safe_dump(summary.best_config, sort_keys=False))
    keys = list(summary.best_params)
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for status, marker in (("finished", "o"), ("stopped early", "x"), ("error", "^")):
            pts = [(r[key], r[metric]) for r in rows if r["status"] == status]
            if pts and all(isinstance(x, (int, float)) for x, _ in pts):
                ax.scatter(*zip(*pts, strict=True), marker=marker, label=status)
            elif pts:
                labels = [str(x) for x, _ in pts]
                ax.scatter(labels, [y for _, y in pts], marker=marker, label=status)
        if all(isinstance(r[key], (int, float)) and r[key] > 0 for r in rows):
            values = sorted({r[key] for r in rows})
            if len(values) > 1 and values[-1] / values[0] >= 100:
                ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{metric}_by_param.png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for result in grid:
        df = result.metrics_dataframe
        if df is None or metric not in df or "round" not in df:
            continue
        label = ", ".join(f"{k}={result.config.get(k)}" for k in keys)
        ax.plot(df["round"], df[metric], marker=".", label=label)
    ax.set_xlabel("round")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    if len(rows) <= 12:
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=100)
    plt.close(fig)
