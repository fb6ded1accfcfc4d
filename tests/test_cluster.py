"""``cluster/``: the launcher YAMLs pass Ray's own validation, the KubeRay manifests carry what a
RayJob needs, and a real multi-process cluster on this machine (``ray start --head`` plus a second
``ray start`` node with logical GPUs, token authentication on) runs ``raysim run`` and
``raysim tune`` submitted as Ray jobs, landing complete in an MLflow server on the head."""

from __future__ import annotations

import copy
import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from raysim.config import ConfigError, load_config
from raysim.placement import check_state_outlives_job, check_store_node, check_store_outlives_job
from raysim.tracking import node_local, store_path
from tests.conftest import ROOT, tiny

CLUSTER = ROOT / "cluster"
LAUNCHERS = sorted(CLUSTER.glob("*.yaml"))
RAY_PIN = re.search(r"^ray\[[^\]]*\]==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)[1]


def launcher_yamls() -> list[Path]:
    return [p for p in LAUNCHERS if "provider" in yaml.safe_load(p.read_text())]


@pytest.mark.parametrize("path", launcher_yamls(), ids=lambda p: p.name)
def test_launcher_yamls_pass_rays_own_validation(path):
    """The check Ray's test suite applies to its example YAMLs (test_autoscaler_yaml.py)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(path.read_text())
    validate_config(prepare_config(copy.deepcopy(raw)))
    # ... and the check can fail: a misspelt key is refused
    broken = copy.deepcopy(raw)
    broken["head_start_ray_comands"] = broken.pop("head_start_ray_commands")
    with pytest.raises(Exception, match="head_start_ray_comands"):
        validate_config(prepare_config(broken))
    # private by default: token auth on every node, dashboard on the head's loopback, the
    # token shipped to every node, nothing but SSH opened
    text = path.read_text()
    assert "start-head.sh" in text and "start-worker.sh" in text
    assert raw["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    for cmd in raw["setup_commands"]:
        assert "requirements.txt" in cmd or ".venv" in cmd  # the pinned versions
    if raw["provider"]["type"] == "aws":
        ports = raw["provider"]["security_group"]["IpPermissions"]
        assert [(p["FromPort"], p["ToPort"]) for p in ports] == [(22, 22)]
    if "docker" in raw:
        assert raw["docker"]["image"].startswith(f"rayproject/ray:{RAY_PIN}-py311")


def test_node_start_scripts_keep_the_cluster_private():
    head = (CLUSTER / "start-head.sh").read_text()
    worker = (CLUSTER / "start-worker.sh").read_text()
    for script in (head, worker):
        assert "export RAY_AUTH_MODE=token" in script
    assert "--dashboard-host=127.0.0.1" in head
    assert "mlflow server --host 127.0.0.1" in head
    assert "0.0.0.0" not in head + worker


def test_kuberay_manifests_carry_what_a_rayjob_needs():
    docs = {
        d["kind"]: d for d in yaml.safe_load_all((CLUSTER / "kuberay/raycluster.yaml").read_text())
    }
    cluster = docs["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["spec"]["rayVersion"] == RAY_PIN
    assert cluster["spec"]["authOptions"]["mode"] == "token"
    head = cluster["spec"]["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP"
    containers = {c["name"]: c for c in head["template"]["spec"]["containers"]}
    uri = next(
        e["value"] for e in containers["ray-head"]["env"] if e["name"] == "MLFLOW_TRACKING_URI"
    )
    assert node_local(uri)  # so every coordinator is kept on the head, beside the server
    assert "127.0.0.1" in containers["mlflow"]["command"]
    workers = cluster["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" in workers["resources"]["limits"]
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"ray.io/cluster": "raysim"}

    (job,) = yaml.safe_load_all((CLUSTER / "kuberay/rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert job["spec"]["entrypoint"].startswith("raysim run ")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    config = job["spec"]["entrypoint"].split()[2]
    assert (ROOT / config.removeprefix("/home/ray/raysim/")).is_file()
    dockerfile = (CLUSTER / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{RAY_PIN}-py311" in dockerfile


def test_runtime_env_leaves_local_state_behind():
    env = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    assert env["working_dir"] == "."
    assert {".venv", "mlruns", "mlflow.db", "tune"} <= set(env["excludes"])
    assert node_local(env["env_vars"]["MLFLOW_TRACKING_URI"])


@pytest.mark.parametrize(
    ("uri", "local"),
    [
        ("sqlite:////tmp/x/mlflow.db", True),
        ("/tmp/mlruns", True),
        ("file:///tmp/mlruns", True),
        ("http://127.0.0.1:5000", True),
        ("http://localhost:5000", True),
        ("http://10.0.0.10:5000", False),
        ("https://mlflow.example.org", False),
        ("postgresql://user@localhost/mlflow", True),
        ("postgresql://user@db.internal/mlflow", False),
        ("databricks", False),
    ],
)
def test_which_stores_only_one_node_reaches(uri, local):
    assert node_local(uri) is local


def test_a_coordinator_away_from_a_node_local_store_is_refused_saying_what_to_set():
    check_store_node("http://10.0.0.10:5000", None, "b" * 56)  # every node reaches it
    check_store_node("sqlite:////x/mlflow.db", "a" * 56, "a" * 56)  # beside it
    with pytest.raises(ConfigError, match=r"local to node a+.*on node b+.*tracking\.uri=http"):
        check_store_node("sqlite:////x/mlflow.db", "a" * 56, "b" * 56)


def test_a_store_inside_a_ray_jobs_temporary_copy_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    check_store_outlives_job(uri)  # not in a job: fine
    monkeypatch.setenv(
        "RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://x"}})
    )
    with pytest.raises(ConfigError, match="vanish with the job.*MLFLOW_TRACKING_URI=http"):
        check_store_outlives_job(uri)
    check_store_outlives_job("http://127.0.0.1:5000")
    check_store_outlives_job("sqlite:////elsewhere/mlflow.db")
    assert store_path("http://127.0.0.1:5000") is None

    # the personal-state store's default folder (relative) would be in the copy too
    def disk(folder: str):
        state = {"store": "disk", "dir": folder}
        return load_config(tiny(clients={"num": 20, "per_round": 5, "state": state}))

    with pytest.raises(ConfigError, match=r"personal-state store.*vanish.*clients\.state\.dir="):
        check_state_outlives_job(disk("raysim-states"))
    check_state_outlives_job(disk("/elsewhere/states"))


def test_coordinator_node_is_a_switch_that_leaves_results_alone():
    from raysim.checkpoint import config_hash

    cfg = load_config(tiny(coordinator={"node": "any"}))
    assert config_hash(cfg) == config_hash(load_config(tiny()))
    with pytest.raises(ConfigError, match="coordinator.node"):
        load_config(tiny(coordinator={"node": "head"}))


# --------------------------------------------------------------------------- a real cluster
def _mlflow_server(port: int, store: Path, env: dict[str, str]) -> subprocess.Popen:
    """The head's MLflow server, as cluster/start-head.sh starts it (``_healthy`` waits)."""
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--backend-store-uri",
         f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination",
         str(store / "mlartifacts")],
        env={**env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def _healthy(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except (OSError, http.client.HTTPException):  # not up yet
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"mlflow server did not come up on port {port} (exit {proc.poll()})")


@pytest.mark.slow
def test_jobs_on_a_multi_process_cluster_land_in_the_heads_mlflow(ray_cluster, tmp_path):
    from mlflow.tracking import MlflowClient

    from tests.loopback import RAY, can_hide_folders, free_port, loopback_cluster

    port = free_port()
    server = _mlflow_server(port, tmp_path, dict(os.environ))  # starts while the cluster does
    uri = f"http://127.0.0.1:{port}"
    # a folder the GPU node does not share with the head: it sees an empty one of its own there
    hidden = tmp_path / "node-local" if can_hide_folders() else None
    try:
        with loopback_cluster(
            head_cpus=2, worker_cpus=2, worker_gpus=1, node_local=hidden
        ) as cluster:
            _healthy(server, port)

            def submit(*entrypoint: str) -> subprocess.CompletedProcess:
                for _ in range(30):  # the head's job agent may still be starting
                    proc = cluster.run(
                        RAY, "job", "submit", f"--address={cluster.dashboard}",
                        "--runtime-env", "cluster/runtime_env.yaml", "--", *entrypoint,
                        cwd=ROOT, timeout=400,
                    )  # fmt: skip
                    if "No available agent" not in proc.stdout + proc.stderr:
                        break
                    time.sleep(2)
                return proc

            small = ["rounds=2", "clients.per_round=4", "workers.count=4", "workers.num_cpus=0",
                     "workers.num_gpus=0.25", f"tracking.uri={uri}"]  # fmt: skip
            # Ditto's personal models in a store both nodes see: the coordinator (head) and the
            # workers (GPU node) write and read each other's files; the end names the folder
            shared = tmp_path / "shared"
            personal = ["algorithm.name=ditto", "clients.state.store=disk"]
            job = submit("raysim", "run", "examples/quickstart.yaml", *small, *personal,
                         f"clients.state.dir={shared}", "tracking.experiment=loopback",
                         "--address", "auto")  # fmt: skip
            assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-2000:]
            (store,) = shared.iterdir()
            assert (store / "STORE.json").is_file() and list(store.glob("*/*.safetensors"))
            assert f"personal-state store: {store}\n" in job.stdout
            client = MlflowClient(uri)
            (run,) = client.search_runs([client.get_experiment_by_name("loopback").experiment_id])
            assert run.info.status == "FINISHED"
            assert len(client.get_metric_history(run.info.run_id, "accuracy")) == 2
            artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
            assert {"weights.safetensors", "config.yaml", "placement.json"} <= artifacts
            placement = client.download_artifacts(run.info.run_id, "placement.json", str(tmp_path))
            placed = json.loads(Path(placement).read_text())
            assert len(placed["workers"]) == 4  # 4 × 0.25 of the one GPU, all on its node
            (gpu_node,) = {w["node_id"] for w in placed["workers"]}
            assert {tuple(w["gpu_ids"]) for w in placed["workers"]} == {("0",)}
            assert all(w["cuda_visible_devices"] == "0" for w in placed["workers"])
            # the coordinator is on the other node, the head: beside the store it writes
            assert placed["coordinator_node"] != gpu_node
            assert run.data.tags["raysim.nodes"] == "1"

            sweep = submit(
                "raysim", "tune", "examples/tune-async.yaml", *small, "clients.num=10",
                "workers.count=1", "eval.every=1", "tune.num_samples=1", "tune.scheduler=fifo",
                "tune.space={algorithm.buffer_size: {grid: [2, 4]}}",
                "tracking.experiment=loopback-sweep", "--address", "auto",
                "--storage", str(tmp_path / "tune"),
            )  # fmt: skip
            assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-2000:]
            exp = client.get_experiment_by_name("loopback-sweep").experiment_id
            runs = client.search_runs([exp])
            assert len(runs) == 3  # the sweep's parent and its two trials
            assert {r.info.status for r in runs} == {"FINISHED"}
            assert "best_config.yaml" in {
                a.path
                for a in client.list_artifacts(
                    next(r for r in runs if "mlflow.parentRunId" not in r.data.tags).info.run_id
                )
            }

            # the default store would be inside the job's temporary copy: one line, nothing run
            lost = submit("env", "-u", "MLFLOW_TRACKING_URI", "raysim", "run",
                          "examples/quickstart.yaml", "--address", "auto")  # fmt: skip
            assert lost.returncode != 0
            assert "would vanish with the job" in lost.stdout
            assert "Traceback" not in lost.stdout
            if hidden is None:
                # a node's own disk is simulated by a mount namespace, which this machine does
                # not allow (unshare --mount needs root or user namespaces); the refusal itself
                # is tested in process (test_state_store.py)
                pytest.skip(
                    "this machine allows no mount namespace (unshare --mount) to give a node "
                    "a folder of its own; all the assertions above passed"
                )
            # a store the workers' node does not see (the coordinator makes it on the head,
            # beside the tracking store): one line naming the setting, no file written
            apart = submit("raysim", "run", "examples/quickstart.yaml", *small, *personal,
                           f"clients.state.dir={hidden / 'states'}",
                           "tracking.experiment=loopback-apart", "--address", "auto")  # fmt: skip
            assert apart.returncode != 0
            # one line (ray job submit repeats the job's last lines when it fails)
            said = {ln for ln in apart.stdout.splitlines() if ln.startswith("raysim: error")}
            assert len(said) == 1, apart.stdout[-3000:]
            (said,) = said
            assert "is not on this node" in said
            assert "clients.state.dir" in said and "Traceback" not in apart.stdout
            assert not list((hidden / "states").rglob("*.safetensors"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    # only what the test started was stopped: the test session's own Ray still answers
    assert ray_cluster.get(ray_cluster.remote(lambda: 7).remote()) == 7
