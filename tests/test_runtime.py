"""End-to-end runs on a real local Ray instance with a real MLflow store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

import raysim
from raysim.launch.resources import ResourceError
from tests.conftest import EXAMPLES, tiny

pytestmark = pytest.mark.slow


def accs(result):
    return [h["accuracy"] for h in result.history]


def test_quickstart_end_to_end_logs_everything(ray_cluster, mlflow_uri):
    res = raysim.run(EXAMPLES / "quickstart.yaml", ["rounds=3"])
    assert len(res.history) == 3 and 0 <= res.metrics["accuracy"] <= 1
    assert res.metrics["total_updates"] == 30 and res.tracking_uri == mlflow_uri
    client = MlflowClient(mlflow_uri)
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.name"] == "fedavg" and run.data.tags["algorithm"] == "fedavg"
    acc_hist = client.get_metric_history(res.run_id, "accuracy")
    assert [m.step for m in acc_hist] == [1, 2, 3]  # the rounds' numbers
    assert [m.value for m in acc_hist] == accs(res)
    for key in ("virtual_time", "wall_time", "clients_arrived", "bytes_up", "bytes_down"):
        assert len(client.get_metric_history(res.run_id, key)) == 3, key
    names = {a.path for a in client.list_artifacts(res.run_id)}
    assert {"config.yaml", "weights.safetensors", "clients.csv", "accuracy.png"} <= names
    from safetensors.numpy import load_file

    local = client.download_artifacts(res.run_id, "weights.safetensors")
    tensors = load_file(local)
    flat = np.concatenate([tensors[k].reshape(-1) for k in tensors])  # saved in parameter order
    assert raysim.launch.session.Result and len(flat) == len(res.weights)
    np.testing.assert_array_equal(np.sort(flat), np.sort(res.weights))
    csv_rows = open(client.download_artifacts(res.run_id, "clients.csv")).read().splitlines()
    assert csv_rows[0].startswith("client,num_samples") and len(csv_rows) > 10
    # what each worker did, and each round's compute on its critical path
    workers = json.load(open(client.download_artifacts(res.run_id, "workers.json")))
    assert sum(w["jobs_run"] for w in workers) == 30
    assert all(w["train_s"] > 0 and w["peak_gpu_bytes"] is None for w in workers)
    for h in res.history:
        assert 0 < h["round_compute_s"] <= h["round_wall_s"], h


@pytest.mark.parametrize(
    "delays",
    [  # matrix tier: test_late_jobs.py runs 1 and 3 Ray workers (one killed) in the fast suite
        pytest.param({"kind": "none"}, marks=pytest.mark.matrix),
        pytest.param({"kind": "half_normal", "sigma": 5.0}, marks=pytest.mark.matrix),
    ],
)
def test_same_result_with_one_or_three_workers(ray_cluster, delays):
    """I-16: determinism whatever the parallelism (1 vs 3 Ray workers: weights, accuracy and
    arrivals per round), with BatchNorm buffers riding in the vector."""
    cfg = tiny(
        delays=delays,
        rounds=4,
        algorithm={"name": "fedbuff", "buffer_size": 3},
        model={"name": "cnn", "channels": [4, 8], "hidden": [16], "batch_norm": True},
        tracking={"enabled": False},
    )
    one = raysim.run(cfg, ["workers.count=1"])
    three = raysim.run(cfg, ["workers.count=3", "workers.num_cpus=0.5"])
    assert one.weights_digest == three.weights_digest
    assert accs(one) == accs(three)
    assert [h["clients_arrived"] for h in one.history] == [
        h["clients_arrived"] for h in three.history
    ]


@pytest.mark.matrix  # suite time: tests/test_transport.py runs the coordinator here
def test_a_coordinator_in_the_callers_process_gives_the_same_run(ray_cluster, mlflow_uri):
    """``RunSession(coordinator_here=True)`` (what a Tune trial uses): no coordinator actor, the
    same weights, metrics and MLflow run as with one. A coordinator with GPUs keeps its actor,
    and so does one a fault is set to kill."""
    from raysim.config import load_config

    cfg = load_config(tiny(rounds=3, workers={"count": 1}))
    results = []
    for here in (False, True):
        session = raysim.RunSession(cfg, coordinator_here=here)
        try:
            assert (session.actor is None) == here and (session.here is not None) == here
            metrics = list(session.rounds())
            results.append((metrics, session.finish()))
        finally:
            session.close()
    (actor_rounds, by_actor), (here_rounds, by_here) = results
    assert by_here.weights_digest == by_actor.weights_digest
    assert [m["accuracy"] for m in here_rounds] == [m["accuracy"] for m in actor_rounds]
    run = MlflowClient(mlflow_uri).get_run(by_here.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["accuracy"] > 0
    from raysim.launch.session import can_host_coordinator

    assert can_host_coordinator(cfg)
    for over in ({"faults": {"kill_coordinator": {"round": 1}}}, {"coordinator": {"num_gpus": 1}}):
        assert not can_host_coordinator(load_config(tiny(**over))), over


def test_a_setup_that_fails_after_its_mlflow_run_was_made_ends_it_failed(
    ray_cluster, mlflow_uri, monkeypatch
):
    """A new run's MLflow run is made in a thread while the workers start; a setup that fails
    after that (here, the server's core) ends it FAILED, with its params, instead of leaving it
    RUNNING."""
    from raysim.actors import coordinator_core
    from raysim.config import load_config
    from raysim.errors import RunSetupError

    def broken(*args, **kwargs):
        raise ValueError("the core broke")

    monkeypatch.setattr(coordinator_core.CoordinatorCore, "__init__", broken)
    cfg = load_config(tiny(rounds=2, workers={"count": 1}, tracking={"run_name": "setup-fails"}))
    with pytest.raises(RunSetupError, match="the core broke"):
        raysim.RunSession(cfg, coordinator_here=True)
    client = MlflowClient(mlflow_uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, "attributes.run_name = 'setup-fails'")
    assert [r.info.status for r in runs] == ["FAILED"]
    assert runs[0].data.params["algorithm.name"] == "fedavg"
    assert "the core broke" in runs[0].data.tags["raysim.error"]


@pytest.mark.matrix  # slow (an actor per client); the 1-vs-3-workers test above runs by default
def test_per_client_actors_equal_pooled_workers(ray_cluster):
    cfg = tiny(clients={"num": 4, "per_round": 3}, delays={"kind": "half_normal", "sigma": 2.0})
    pooled = raysim.run(cfg, ["workers.execution=sequential"])  # per_client is sequential
    pinned = raysim.run(cfg, ["workers.count=per_client", "workers.num_cpus=0.1"])
    assert pooled.weights_digest == pinned.weights_digest


#: the run every fault test below must end identical to
FAULTS = tiny(rounds=4, workers={"count": 1}, delays={"kind": "half_normal", "sigma": 2.0})


@pytest.fixture(scope="module")
def clean(ray_cluster):
    """``FAULTS`` run once, undisturbed."""
    return raysim.run(FAULTS)


@pytest.mark.matrix  # suite time (~25 s on 2 vCPUs): the fast suite's budget
def test_killed_worker_is_replaced_and_result_unchanged(clean):
    faulty = raysim.run(FAULTS, ["faults.kill_worker.round=2", "faults.kill_worker.worker=0"])
    assert faulty.weights_digest == clean.weights_digest
    assert accs(faulty) == accs(clean)
    # the restart leaves a trace: a per-round metric (and a warning in the console and MLflow)
    assert sum(h["worker_restarts"] for h in faulty.history) == 1
    assert sum(h["worker_restarts"] for h in clean.history) == 0


def _replaced_once(client, result, resumed_at: str) -> None:
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["raysim.coordinator_restarts"] == "1"
    assert run.data.tags["raysim.resumed_at_round"] == resumed_at
    history = client.get_metric_history(result.run_id, "accuracy")
    assert [m.step for m in history] == list(range(1, 5))  # one value per round, none twice


@pytest.mark.matrix  # suite time (~19 s on 2 vCPUs): the fast suite's budget
def test_killed_coordinator_is_replaced_and_result_unchanged(clean, mlflow_uri):
    """The driver starts another coordinator from the newest checkpoint, replays to where the
    dead one was, and the run ends as if nothing happened: same weights, FINISHED, recorded."""
    faulty = raysim.run(FAULTS, ["checkpoint.every=2", "faults.kill_coordinator.round=3"])
    assert faulty.weights_digest == clean.weights_digest
    assert accs(faulty) == accs(clean)
    _replaced_once(MlflowClient(mlflow_uri), faulty, resumed_at="2")


@pytest.mark.matrix  # suite time: the replaced coordinator's run is checked above
def test_a_replaced_coordinators_workers_are_ended_with_it(clean):
    """The driver starts the first coordinator's workers beside it and owns them, so they would
    outlive it: when it dies the driver ends them, and only the replacement's workers run."""
    import ray._private.state as state

    from raysim.config import load_config

    cfg = load_config(FAULTS, ["checkpoint.every=2", "faults.kill_coordinator.round=3"])
    session = raysim.RunSession(cfg)
    try:
        assert len(session._own_workers) == 1
        list(session.rounds())
        alive = [
            a
            for a in state.actors().values()
            if a["ActorClassName"] == "Worker" and a["State"] == "ALIVE"
        ]
        assert session.coordinator_restarts == 1 and len(alive) == 1, alive
    finally:
        session.close()


@pytest.mark.matrix  # benchmarks/reliability.py also kills the coordinator while it starts
def test_coordinator_dying_at_start_up_leaves_one_run(clean, mlflow_uri, monkeypatch):
    """A coordinator that dies after opening its MLflow run but before the driver heard of it:
    the replacement finds that run by the session tag and reopens it at round 0 (no checkpoint);
    no orphan is left. A death mid-run without a checkpoint replays from round 0 the same way
    (benchmarks/reliability.py kills the process at random moments, with and without)."""
    import ray

    start = raysim.RunSession._start_coordinator
    died: list[str] = []

    def dies_once(self, source):
        info = start(self, source)
        if not died:
            died.append(self.run_id)
            ray.kill(self.actor, no_restart=True)
            self.run_id = None
            raise ray.exceptions.ActorDiedError()
        return info

    monkeypatch.setattr(raysim.RunSession, "_start_coordinator", dies_once)
    res = raysim.run(FAULTS, ["tracking.experiment=dies-at-start-up"])
    assert res.weights_digest == clean.weights_digest
    client = MlflowClient(mlflow_uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "dies-at-start-up"]
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_id == res.run_id == died[0]
    _replaced_once(client, res, resumed_at="0")


def test_unwritable_artifact_store_loses_nothing(clean, mlflow_uri, tmp_path, monkeypatch):
    """Artifacts that cannot be written mid-run: checkpoints are skipped with a warning, the run
    finishes with the same weights, which the driver saves locally, and MLflow says FAILED."""
    import shutil

    from safetensors.numpy import load_file

    monkeypatch.chdir(tmp_path)
    session = raysim.RunSession(raysim.load_config(FAULTS, ["checkpoint.every=1"]))
    try:
        session.step()
        client = MlflowClient(mlflow_uri)
        artifacts = Path(client.get_run(session.run_id).info.artifact_uri.removeprefix("file://"))
        shutil.rmtree(artifacts)
        artifacts.write_text("not a directory")  # every write below it fails, even as root
        for _ in session.rounds():
            pass
        res = session.finish()
    finally:
        session.close()
    assert res.weights_digest == clean.weights_digest
    assert "could not be written" in res.unsaved
    saved = load_file(tmp_path / "raysim-unsaved" / res.run_id / "weights.safetensors")
    assert np.concatenate([v.ravel() for v in saved.values()]).size == res.weights.size
    run = client.get_run(res.run_id)
    assert run.info.status == "FAILED" and "could not be written" in run.data.tags["raysim.error"]
    steps = [m.step for m in client.get_metric_history(res.run_id, "accuracy")]
    assert steps == list(range(1, 5))


@pytest.mark.matrix  # the replaced-worker test above sees the new process as a restart
def test_killed_worker_restarts_with_new_process(ray_cluster):
    session = raysim.RunSession(raysim.load_config(tiny(rounds=3, workers={"count": 1})))
    try:
        import ray

        session.step()
        before = session.workers()[0]["pid"]
        ray.get(session.actor.kill_worker.remote(0))
        session.step()
        assert session.workers()[0]["pid"] != before
    finally:
        session.close()


def test_non_finite_update_is_rejected_and_run_continues(ray_cluster, mlflow_uri):
    cfg = tiny(clients={"num": 6, "per_round": 6}, rounds=3)
    res = raysim.run(cfg, ["faults.corrupt_updates=[{client: 2, round: 1, value: inf}]"])
    assert res.metrics["rejected_updates"] == 1
    assert [h["clients_arrived"] for h in res.history] == [6, 5, 6]
    assert np.isfinite(res.weights).all() and math.isfinite(res.metrics["loss"])
    row = next(r for r in res.clients if r["client"] == 2)
    assert row["rejected"] == 1 and row["arrived"] == 2
    client = MlflowClient(mlflow_uri)
    names = {a.path for a in client.list_artifacts(res.run_id)}
    assert "warnings.txt" in names


@pytest.mark.matrix  # tests/test_cluster.py places 4 × 0.25-GPU workers on a two-node cluster
def test_fractional_gpu_workers_see_their_logical_gpu(ray_cluster):
    session = raysim.RunSession(
        raysim.load_config(tiny(rounds=1, workers={"count": 4, "num_cpus": 0.25, "num_gpus": 0.25}))
    )
    try:
        info = session.workers()
        assert len(info) == 4
        assert all(len(w["gpu_ids"]) == 1 and w["cuda_visible_devices"] for w in info)
        session.step()
    finally:
        session.close()


@pytest.mark.parametrize(
    "override, needle",
    [
        ("workers.num_gpus=8", "do not fit"),
        ("workers.count=9", "do not fit"),
    ],
)
def test_impossible_resources_fail_clearly(ray_cluster, override, needle):
    with pytest.raises(ResourceError, match=needle):
        raysim.run(tiny(), [override])


@pytest.mark.matrix  # tests/test_regression.py runs the same example for the three methods
@pytest.mark.parametrize("method", ["fedavg", "fedbuff", "fedasync"])
def test_async_mini_example_runs(ray_cluster, method):
    res = raysim.run(
        EXAMPLES / "async-mini.yaml",
        [f"algorithm.name={method}", "rounds=8", "eval.every=4", "tracking.enabled=false"],
    )
    assert res.run_id is None and len(res.history) == 8
    staleness = [h["staleness_rounds_max"] for h in res.history if "staleness_rounds_max" in h]
    assert max(staleness) >= 1  # σ = 5: some updates are stale
    assert 0 < res.metrics["accuracy"] <= 1


@pytest.mark.matrix  # suite time (~15 s on 2 vCPUs): the fast suite's budget
def test_bbc_news_text_task(ray_cluster):
    res = raysim.run(
        tiny(
            data={"name": "bbc_news", "partition": {"kind": "iid"}},
            model={"name": "bag_of_embeddings", "embed_dim": 32, "hidden": []},
            rounds=6,
            local={"epochs": 2, "batch_size": 16, "lr": 0.5},
        )
    )
    assert res.metrics["accuracy"] > 0.4  # 5 balanced-ish topics: chance is about 0.23


AGENT_PORT_PROBE = """
import os, socket
import ray._private.utils as utils
from raysim.launch.session import ensure_ray
checks, real_check = [], utils.get_dashboard_dependency_error
utils.get_dashboard_dependency_error = lambda: checks.append(1) or real_check()
dashboard = real_check() is None
held = socket.socket()
held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    held.bind(("0.0.0.0", 52365)); held.listen()  # as another Ray on this machine would
except OSError:
    pass  # another Ray holds it already
ensure_ray(num_cpus=1)
import ray
node = ray._private.worker._global_node
port = node._ray_params.dashboard_agent_listen_port
monitor = "monitor" in node.all_processes
raylet = node.all_processes["raylet"][0].process.pid
with open(f"/proc/{raylet}/environ", "rb") as f:
    env = dict(e.split(b"=", 1) for e in f.read().split(b"\\0") if b"=" in e)
retry = env.get(b"RAY_raylet_client_connect_timeout_milliseconds", b"-").decode()
kept = "RAY_raylet_client_connect_timeout_milliseconds" in os.environ
api = "dashboard" in node.all_processes and node.webui_url == ""
import signal, threading, time
@ray.remote(num_cpus=0)
def hang():
    time.sleep(60)
sent = []
def interrupt():  # 0.5 s into a blocking ray.get: halfway between two of Ray's own looks
    time.sleep(0.5); sent.append(time.perf_counter()); os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=interrupt).start()
try:
    ray.get(hang.remote())
except KeyboardInterrupt:
    late = time.perf_counter() - sent[0]
print(f"port={port} monitor={monitor} retry_ms={retry} kept={kept} api={api} "
      f"checks={len(checks)} dashboard={dashboard} signal_late={late:.2f}")
ray.shutdown()
"""


def test_a_private_ray_starts_beside_another_without_waiting_for_its_agent_port(tmp_path):
    """With 52365 taken, Ray's agent would retry it for ~3.5 s and run without it (port -1);
    a private Ray starts no autoscaler monitor (1 s to stop); its raylet retries its first
    connection to its object store after 0.1 s, not 1 s (``PRIVATE_RAY_ENV``), and the
    caller's environment is left as it was; Ray's API server, started beside the raylet, is up
    and registered once ``ensure_ray`` returns. Also where the dashboard's packages are absent
    (the GPU machine's bundle: ``ray`` without ``[default]``), but for the agent's port. A
    signal reaches the driver's Python within 0.1 s of a blocking ``ray.get`` (``DRIVER_RAY_ENV``),
    not Ray's 1 s: the stop of a run setting up (``tests/test_first_hour.py``) took 5 s in CI."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", AGENT_PORT_PROBE], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    port = int(line.split()[0].removeprefix("port="))
    if "dashboard=True" in line:  # Ray's agent runs only with ray[default]'s packages
        assert port > 0 and port != 52365, line
    assert "monitor=False" in line
    assert "retry_ms=100 kept=False api=True" in line, line
    # Ray's check for the dashboard's packages, made once before the API server's thread starts
    # (in that thread and the raylet's start at once, a half-imported module could pass it)
    assert "checks=1 " in line, line
    assert float(line.rsplit("signal_late=", 1)[1]) < 0.3, line  # ~0.5 s with Ray's 1 s
