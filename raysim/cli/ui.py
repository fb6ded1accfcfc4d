"""``raysim ui``: the MLflow UI for the run store, served on 127.0.0.1 (its log in a private
file)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from raysim.cli.common import Terminated, console, errors, on_sigterm

#: MLflow 3.17's UI opens experiments in its GenAI view (traces, no runs table) and ignores the
#: experiment tag that earlier 3.x releases read; a URL can name the model-training view, and the
#: UI's own toggle remembers the choice (tests/test_ui_browser.py checks both in Chromium)
UI_VIEW = "workflowType=machine_learning"
UI_HINT = (
    "MLflow 3.17 opens experiments in its GenAI view: pick 'Model training' at the top left "
    "once and it stays (the link above opens that view)"
)


def cmd_ui(args: argparse.Namespace) -> int:
    from raysim.tracking.store import default_tracking_uri, open_store

    uri = args.uri or default_tracking_uri()
    client = open_store(uri)  # a copied project's store reads its own artifacts
    # the server's own chatter (its deprecation warnings, a line per request) goes to a log file;
    # the console gets raysim's lines, and the log's end if the server fails
    env = dict(
        os.environ,
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
        PYTHONWARNINGS="ignore::DeprecationWarning",
    )
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--registry-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--workers",
        "1",
        "--uvicorn-opts",
        "--log-level warning",
    ]
    log = ui_log(args.port)

    def _terminate(signum: int, frame: Any) -> None:  # `kill PID` stops the server too
        raise Terminated

    with on_sigterm(_terminate), log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            return _serve_ui(proc, f"http://127.0.0.1:{args.port}", uri, client, args.check, log)
        except KeyboardInterrupt:
            return 0
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)


def ui_log(port: int) -> Path:
    """A new file for the ui's server log: a unique name in the temp folder, 0600 (it may
    show the store's paths and what the server was asked)."""
    fd, name = tempfile.mkstemp(prefix=f"raysim-ui-{port}-", suffix=".log")
    os.close(fd)
    return Path(name)


def _serve_ui(
    proc: subprocess.Popen, url: str, uri: str, client: Any, check: bool, log: Path
) -> int:
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.5)
    if proc.poll() is not None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        errors.print(tail, markup=False, highlight=False)
        errors.print(
            f"raysim: error: mlflow server exited with code {proc.returncode} (its log: {log})",
            style="red",
            markup=False,
        )
        return 1
    console.print(
        f"MLflow UI for {uri} at [bold]{_ui_landing(url, client)}[/bold] (pid {proc.pid}; "
        f"the server's log: {log}); Ctrl-C stops it",
        soft_wrap=True,
    )
    console.print(UI_HINT, soft_wrap=True, markup=False)
    return 0 if check else proc.wait()


def _ui_landing(url: str, client: Any) -> str:
    """The runs table of the experiment with the newest run, in the model-training view."""
    exps = [e.experiment_id for e in client.search_experiments()]
    newest = client.search_runs(exps, order_by=["attributes.start_time DESC"], max_results=1)
    if not newest:
        return f"{url}/#/experiments?{UI_VIEW}"
    return f"{url}/#/experiments/{newest[0].info.experiment_id}/runs?{UI_VIEW}"
