"""The run's summary table shows a long MLflow store path whole (folded), never cut."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from raysim.cli.run import _summary_table


def test_a_long_store_path_is_folded_not_cut():
    store = "sqlite:///" + "/deep" * 20 + "/mlflow.db"
    metrics = {"rounds": 3, "total_updates": 30, "rejected_updates": 0, "total_bytes_up": 1.0,
               "total_bytes_down": 1.0, "wall_time_s": 1.0}  # fmt: skip
    config = SimpleNamespace(name="q", algorithm=SimpleNamespace(name="fedavg"), rounds=3,
                             eval=SimpleNamespace(final_window=5))  # fmt: skip
    result = SimpleNamespace(metrics=metrics, config=config, run_id="r1", tracking_uri=store)
    console = Console(width=80, record=True)
    console.print(_summary_table(result))
    cells = "".join(
        line.split("│")[2].strip() for line in console.export_text().splitlines() if "│" in line
    )
    assert store in cells and "…" not in cells
