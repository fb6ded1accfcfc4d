"""``Coordinator.stop`` while the run sets up: it answers at once where the MLflow run is not begun
(and none is made after), and waits for one being made, which then ends KILLED. The driver's stop
in start-up takes the stop's time on top of Ray's: CI saw 5 s against the 2 s asked (issue 42.1)
where the stop waited for the store to open (~2 s on 2 vCPUs)."""

from __future__ import annotations

import threading
import time

import pytest
from mlflow.tracking import MlflowClient

from raysim.actors import coordinator_actor
from raysim.actors.coordinator_actor import Coordinator
from raysim.config import load_config
from raysim.errors import RunSetupError
from tests.conftest import tiny

SLOW_S = 1.5  # how long the patched step takes: far above a stop's own time


def _setting_up(uri: str) -> tuple[Coordinator, threading.Thread, list[BaseException]]:
    """A coordinator in this process (no Ray), its set-up (``ready``) running in a thread."""
    cfg = load_config(tiny(rounds=1, workers={"count": 1}))
    coordinator = Coordinator(cfg.to_dict(), 1, uri, session="s", worker_here=True)
    raised: list[BaseException] = []

    def ready() -> None:
        try:
            coordinator.ready()
        except BaseException as e:  # noqa: BLE001 - kept for the test to read
            raised.append(e)

    thread = threading.Thread(target=ready)
    thread.start()
    return coordinator, thread, raised


def _statuses(uri: str) -> list[str]:
    client = MlflowClient(uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    return [r.info.status for r in client.search_runs(exps)] if exps else []


def _stop_when(coordinator: Coordinator, reached: threading.Event) -> float:
    assert reached.wait(60), "set-up never reached the step to stop it in"
    began = time.perf_counter()
    stopped = coordinator.stop()
    assert stopped["round"] in (None, 0) and stopped["saved_round"] is None, stopped
    return time.perf_counter() - began


def test_a_stop_while_the_store_opens_answers_at_once_and_no_run_is_made(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    making = threading.Event()
    real_open, real_new = coordinator_actor._open_quietly, Coordinator._new_tracker

    def slow_open(where: str) -> None:
        time.sleep(SLOW_S)
        real_open(where)

    def new_tracker(self, *args, **kwargs):
        making.set()  # set-up waits for the run's MLflow run now: its store is still opening
        return real_new(self, *args, **kwargs)

    monkeypatch.setattr(coordinator_actor, "_open_quietly", slow_open)
    monkeypatch.setattr(Coordinator, "_new_tracker", new_tracker)
    coordinator, thread, raised = _setting_up(uri)
    took = _stop_when(coordinator, making)
    thread.join(120)
    coordinator.close()
    assert took < SLOW_S / 3, took  # it waited for the store to open before, and the run made
    assert len(raised) == 1 and isinstance(raised[0], RunSetupError), raised
    assert "stopped before its MLflow run was made" in str(raised[0])
    assert _statuses(uri) == []  # none made after the stop either


def test_a_stop_while_the_run_is_made_waits_for_it_and_it_ends_killed(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    making = threading.Event()
    real = Coordinator._make_tracker

    def slow_make(self, *args, **kwargs):
        tracker = real(self, *args, **kwargs)  # the run exists in MLflow, RUNNING
        making.set()
        time.sleep(SLOW_S)
        return tracker

    monkeypatch.setattr(Coordinator, "_make_tracker", slow_make)
    coordinator, thread, raised = _setting_up(uri)
    took = _stop_when(coordinator, making)
    # the stop came back only once the run was marked: an actor ended now leaves it KILLED
    assert _statuses(uri) == ["KILLED"]
    assert took > SLOW_S / 2, took
    thread.join(120)
    coordinator.close()
    assert _statuses(uri) == ["KILLED"]


@pytest.mark.parametrize("stopped", [False, True])
def test_a_run_not_stopped_opens_as_before(tmp_path, stopped):
    """Control: the same set-up, not stopped, makes its run and stays RUNNING until closed."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    coordinator, thread, raised = _setting_up(uri)
    thread.join(120)
    assert raised == [] and _statuses(uri) == ["RUNNING"]
    if stopped:
        coordinator.stop()
    coordinator.close()
    assert _statuses(uri) == ["KILLED"]
