"""Tracking store selection, the accuracy plot and the `raysim ui` server."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from raysim.tracking import default_tracking_uri, plot_curves


def test_env_tracking_uri_overrides_default(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/x.db")
    assert default_tracking_uri(tmp_path) == "sqlite:////elsewhere/x.db"


def test_accuracy_plot_is_a_png(tmp_path):
    hist = [{"virtual_time": t + 1.0, "accuracy": 0.1 * t, "loss": 2.0 - 0.1 * t} for t in range(8)]
    plot_curves(hist, tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ui_serves_the_store_on_localhost(tmp_path):
    uri = f"sqlite:///{tmp_path / 'ui.db'}"
    port = _free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "raysim.cli", "ui", "--uri", uri, "--port", str(port), "--check"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"http://127.0.0.1:{port}" in proc.stdout
