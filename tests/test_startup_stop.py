"""A stop in the first seconds: SIGTERM to the run's process group after its MLflow run was made
and before its first round leaves the run KILLED, not RUNNING for ever, on both runtimes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES

RAYSIM = str(Path(sys.executable).with_name("raysim"))


def runs(db: Path) -> list[tuple[str, str]]:
    """The store's runs (status, and whether a round's metric was logged), or none yet."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(db) as con:
            return con.execute(
                "select status, (select count(*) from metrics m where m.run_uuid = r.run_uuid) "
                "from runs r"
            ).fetchall()
    except sqlite3.Error:  # the schema is still being made
        return []


@pytest.mark.slow
@pytest.mark.parametrize(
    "runtime",
    ["auto", pytest.param("ray", marks=pytest.mark.matrix)],  # ray: a private Ray's start-up
)
def test_sigterm_between_the_runs_creation_and_its_first_round_marks_it_killed(tmp_path, runtime):
    db = tmp_path / "mlflow.db"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [RAYSIM, "run", str(EXAMPLES / "quickstart.yaml"), "rounds=5",
         f"tracking.uri=sqlite:///{db}", f"runtime={runtime}"],
        cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not runs(db) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        made = runs(db)
        assert made and made[0][1] == 0, (made, proc.poll())  # made, and no round logged yet
        os.killpg(proc.pid, signal.SIGTERM)  # what `timeout` and job schedulers send
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped during start-up" in err
    assert [status for status, _ in runs(db)] == ["KILLED"]
