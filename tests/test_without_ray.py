"""``runtime``: a run without Ray where Ray would add nothing, and the MLflow writer's process.

The end-to-end checks run in a fresh process each: this test session's Ray (``ray_cluster``)
would otherwise keep every ``runtime: auto`` run on Ray."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from raysim.config import ConfigError, load_config
from raysim.launch.without_ray import auto_prefers_ray, gpus_visible, needs_ray, runs_without_ray
from tests.conftest import EXAMPLES, fresh_cli, tiny

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
#: a fresh process that sees no GPU, so that ``runtime: auto`` may leave Ray out on a GPU box
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch):
    """The decisions below are those of a machine without a GPU (a GPU box keeps auto on Ray:
    ``test_a_visible_gpu_keeps_a_cpu_run_on_ray``)."""
    monkeypatch.setattr("raysim.launch.without_ray.gpus_visible", lambda: False)


def _cfg(*overrides: str):
    return load_config(QUICKSTART, list(overrides))


def test_the_quickstart_needs_no_ray_whatever_the_cores(monkeypatch):
    """Its round's 10 clients train as one group (workers.group_size 16): one group at a time,
    however many workers ``workers.count: auto`` would plan."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for cores in (1, 2, 64):
        monkeypatch.setattr("raysim.launch.resources.cpu_count", lambda c=cores: c)
        assert needs_ray(_cfg()) is None


@pytest.mark.parametrize(
    ("overrides", "address", "reason"),
    [
        (["workers.count=2"], None, "workers.count=2 asks for 2 worker actors"),
        (["workers.num_gpus=0.5"], None, "asks for GPUs"),
        (["coordinator.num_gpus=1"], None, "asks for GPUs"),
        (["workers.count=per_client", "clients.num=8", "clients.per_round=4"], None, "per_client"),
        (["faults.kill_worker.round=1"], None, "process fault"),
        (["workers.transport=calls"], None, "workers.transport=calls"),
        ([], "ray://head:10001", "Ray cluster at ray://head:10001"),
        # one client at a time: a pool trains a round's 10 side by side
        (["workers.execution=sequential"], None, "in 10 groups, which 4 workers"),
    ],
)
def test_what_keeps_a_run_on_ray_is_named(monkeypatch, overrides, address, reason):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("raysim.launch.resources.cpu_count", lambda: 4)
    cfg = _cfg(*overrides)
    why = needs_ray(cfg, address)
    assert why is not None and reason in why
    assert not runs_without_ray(cfg, address)
    with pytest.raises(ConfigError, match=f"runtime=local .*{reason.split()[0]}"):
        runs_without_ray(cfg.model_copy(update={"runtime": "local"}), address)


def test_a_visible_gpu_keeps_a_cpu_run_on_ray(monkeypatch):
    """Ray hides the GPU from CPU workers; in this process ``model.device: auto`` would take
    it, and the run's bits would change with the machine's GPU."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("raysim.launch.without_ray.gpus_visible", lambda: True)
    monkeypatch.setattr("raysim.launch.without_ray.ray_is_up", lambda: False)
    assert needs_ray(_cfg()) is None and not runs_without_ray(_cfg())
    assert "has a GPU" in auto_prefers_ray()
    assert runs_without_ray(_cfg("runtime=local"))  # asked for: the run may take the GPU
    monkeypatch.undo()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not gpus_visible()


def test_runtime_ray_keeps_ray_and_ray_address_names_a_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("raysim.launch.without_ray.ray_is_up", lambda: False)  # the session's Ray
    assert runs_without_ray(_cfg()) and not runs_without_ray(_cfg("runtime=ray"))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert "10.0.0.1:6379" in needs_ray(_cfg())


def test_ray_already_up_in_the_process_keeps_an_auto_run_on_it(ray_cluster, monkeypatch):
    """A notebook's or a Tune trial's Ray is used; ``runtime: local`` still runs without it."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert needs_ray(_cfg()) is None
    assert not runs_without_ray(_cfg()) and runs_without_ray(_cfg("runtime=local"))


@pytest.mark.slow
@pytest.mark.matrix  # suite time (~30 s); CI runs the matrix tier too
def test_a_run_without_ray_resumes_on_ray_bit_identically(ray_cluster, tmp_path):
    """A run stopped without Ray resumes on Ray (the session's) from its checkpoint
    (``runtime`` is free across a resume) to the weights of the same run without Ray; MLflow has
    every round once, the placement says where it ran, and the run's end. (Ray's own runs of the
    quickstart give these weights too: ``tests/test_regression.py``, ``test_runtime.py``.)"""
    from raysim.launch.session import RunSession

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def config(*overrides: str):
        return _cfg("rounds=6", "eval.every=2", f"tracking.uri={uri}", *overrides)

    def finish(session: RunSession) -> tuple[str, str]:
        try:
            for _ in session.rounds():
                pass
            res = session.finish()
            return res.weights_digest, res.run_id
        finally:
            session.close()

    cut = RunSession(config("runtime=local", "checkpoint.every=1"))
    assert cut.local and cut.actor is None
    for _ in cut.rounds():
        if cut.round == 3:
            break
    cut.stop()
    cut.close()
    saved = cut.stopped["saved_round"]
    local_digest, local_run = finish(RunSession(config("runtime=local")))
    resumed = RunSession(config("runtime=ray", "checkpoint.every=1"), resume=cut.run_id)
    assert not resumed.local and resumed.actor is not None
    resumed_digest, resumed_run = finish(resumed)
    assert local_digest == resumed_digest
    assert resumed_run == cut.run_id

    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(local_run)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(local_run, "round")] == [1, 2, 3, 4, 5, 6]
    assert len(client.get_metric_history(local_run, "accuracy")) == 3
    placement = json.loads(open(client.download_artifacts(local_run, "placement.json")).read())
    # this process, on the session Ray's node (``local:HOST`` where no Ray is up at all)
    (worker,) = placement["workers"]
    assert worker["mode"] == "in_process" and worker["pid"] == os.getpid()
    assert placement["coordinator_node"] == worker["node_id"]
    resumed_run = client.get_run(resumed_run)
    assert resumed_run.info.status == "FINISHED"
    # the coordinator runs ahead of the driver's count: its newest checkpoint, before the end
    assert 3 <= saved < 6
    assert resumed_run.data.tags["raysim.resumed_at_round"] == str(saved)
    steps = [m.step for m in client.get_metric_history(resumed_run.info.run_id, "round")]
    assert steps == [1, 2, 3, 4, 5, 6]  # once each: the resumed attempt logs rounds 4-6


def _writer(uri: str):
    from raysim.tracking.process import TrackerProcess

    return TrackerProcess(uri).open(
        experiment="writer", run_name="w", params={"a": 1}, tags={"t": "x"}
    )


def test_the_writer_process_keeps_order_and_reports_a_lost_call_at_the_next_wait(tmp_path):
    """Rounds and tags are sent without waiting and land in order; an error in one of them
    (here a tag name MLflow refuses) is raised by the next call that waits, and the writer
    goes on after it."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'w.db'}"
    writer = _writer(uri)
    try:
        with writer.rounds_batched():
            for step in range(1, 4):
                writer.log_round(step, {"loss": 1.0 / step})
        writer.set_tag("after", "rounds")
        writer.set_tag("bad key \x00", "x")  # MLflow refuses the name
        with pytest.raises(Exception, match="(?i)invalid|name|key"):
            writer.flush()
        writer.log_round(4, {"loss": 0.25})
        writer.flush()  # the error was reported once; the writer goes on
        client = MlflowClient(uri)
        history = client.get_metric_history(writer.run_id, "loss")
        assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.25)]
        assert client.get_run(writer.run_id).data.tags["after"] == "rounds"
    finally:
        writer.fail("KILLED")
        writer.close()


def test_the_writer_outlives_a_group_signal_and_ends_with_its_pipe(tmp_path):
    """``timeout`` or a batch scheduler signals the whole group: the writer stays, so the run
    can still mark itself KILLED through it; it exits once the run closes its pipe."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'w.db'}"
    writer = _writer(uri)
    child = writer._proc
    for sig in (signal.SIGTERM, signal.SIGINT):
        os.kill(child.pid, sig)
    time.sleep(0.3)
    assert child.poll() is None
    writer.fail("KILLED")
    assert MlflowClient(uri).get_run(writer.run_id).info.status == "KILLED"
    writer.close()
    assert child.returncode == 0


def test_tiny_runs_on_the_test_sessions_ray(ray_cluster):
    """The suite's own runs stay on Ray: ``runtime: auto`` never leaves a Ray that is up."""
    from raysim.config import RunConfig
    from raysim.launch.session import RunSession

    cfg = RunConfig.model_validate(
        tiny(rounds=1, workers={"count": "auto"}, tracking={"enabled": False})
    )
    session = RunSession(cfg)
    try:
        assert not session.local and session.actor is not None
    finally:
        session.close()


def test_the_dry_run_says_whether_ray_starts_and_why(tmp_path):
    """``raysim run --dry-run`` names the process the run would use, and why Ray where it
    would start it."""
    here = fresh_cli(["run", QUICKSTART, "--dry-run"], tmp_path, env=NO_GPU)
    assert here.returncode == 0, here.stderr
    assert "runtime: this process, without Ray (runtime=auto: " in here.stdout
    assert "runtime=ray to start Ray)" in here.stdout
    assert "workers: 1, in this process" in here.stdout
    sequential = ["run", QUICKSTART, "workers.execution=sequential", "--dry-run"]
    ray = fresh_cli(sequential, tmp_path, env=NO_GPU)
    assert ray.returncode == 0, ray.stderr
    assert (
        "runtime: a private local Ray (on Ray: a round trains its clients in 10 groups"
        in " ".join(ray.stdout.split())
    )


def test_a_stop_signal_waits_for_the_checkpoint_being_written():
    """Without Ray the signal's handler raises in the thread that writes a checkpoint; the save
    holds SIGTERM back, so the round it records is known before the stop (a race the mid-run
    SIGTERM test lost under load: the tag was in MLflow, the coordinator had not noted it)."""
    from raysim.actors.coordinator_actor import _stop_signals_held

    seen: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append("stop"))
    try:
        with _stop_signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            seen.append("saved")
        time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == ["saved", "stop"]
