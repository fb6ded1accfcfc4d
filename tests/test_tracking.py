"""Tracking store selection and the accuracy plot (`raysim ui`: tests/test_ui_browser.py)."""

from __future__ import annotations

from raysim.tracking import default_tracking_uri, plot_curves, rows_csv


def test_env_tracking_uri_overrides_default(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/x.db")
    assert default_tracking_uri(tmp_path) == "sqlite:////elsewhere/x.db"


def test_accuracy_plot_is_a_png(tmp_path):
    hist = [{"virtual_time": t + 1.0, "accuracy": 0.1 * t, "loss": 2.0 - 0.1 * t} for t in range(8)]
    plot_curves(hist, tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_client_table_takes_every_column_of_any_row():
    """Personalised async runs: clients that have not reported yet have no scores (the first
    row may lack columns a later row has); the table keeps them all, with empty cells."""
    rows = [{"client": 0, "samples": 3}, {"client": 1, "samples": 4, "accuracy": 0.5}]
    assert rows_csv(rows).splitlines() == ["client,samples,accuracy", "0,3,", "1,4,0.5"]
