"""A run's plan (``raysim.launch.plan``): resolved once, printed by ``--dry-run``, followed by the
run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raysim.config import ConfigError, load_config
from raysim.launch.plan import plan_run
from tests.conftest import EXAMPLES, ROOT, fresh_cli

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}
SHORT = ["rounds=2", "tracking.enabled=false"]
COORDINATOR_CPUS = 0  # coordinator.num_cpus by default

#: a fresh process runs the config and prints the plan it followed and what it started
FOLLOW = """
import json, os, sys
import raysim

facts = {}

def on_start(session):
    workers = session.workers()
    facts.update(local=session.local, coordinator_here=session.here is not None,
                 workers=len(workers), pids=sorted({w["pid"] for w in workers}),
                 driver=os.getpid())

result = raysim.run(sys.argv[1], sys.argv[2:], on_start=on_start)
print("PLAN<<" + result.plan + ">>")
print("FACTS " + json.dumps(facts))
"""


def followed(tmp_path, overrides: list[str]) -> tuple[str, dict]:
    env = {**NO_GPU, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", FOLLOW, QUICKSTART, *overrides],
        cwd=tmp_path,
        env={**__import__("os").environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    plan = out.stdout.split("PLAN<<", 1)[1].split(">>", 1)[0]
    facts = json.loads(out.stdout.split("FACTS ", 1)[1].splitlines()[0])
    return plan, facts


def dry_run(tmp_path, overrides: list[str]) -> str:
    out = fresh_cli(["run", QUICKSTART, *overrides, "--dry-run"], tmp_path, env=NO_GPU)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("dry run: "), out.stdout
    return out.stdout.removeprefix("dry run: ").rstrip("\n")


@pytest.mark.parametrize(
    "extra",
    [[], pytest.param(["workers.execution=sequential"], marks=pytest.mark.matrix)],
    ids=["without-ray", "on-a-private-ray"],
)
def test_the_dry_run_prints_the_plan_that_the_run_then_follows(tmp_path, extra):
    """The plan ``--dry-run`` prints is the one the run records, and what the run started
    (its process, its workers) is what the plan says."""
    overrides = [*SHORT, *extra]
    printed = dry_run(tmp_path, overrides)
    plan, facts = followed(tmp_path, overrides)
    assert plan == printed
    lines = dict(line.split(": ", 1) for line in plan.splitlines()[1:])
    if facts["local"]:
        assert lines["runtime"].startswith("this process, without Ray")
        assert lines["coordinator"] == "in this process" and facts["coordinator_here"]
        assert lines["workers"] == "1, in this process"
        assert facts["workers"] == 1 and facts["pids"] == [facts["driver"]]
    else:
        assert lines["runtime"].startswith("a private local Ray (on Ray: a round trains")
        assert lines["coordinator"].startswith("its own actor") and not facts["coordinator_here"]
        n = int(lines["workers"].split()[0])
        assert lines["workers"].startswith(f"{n} actor") and facts["workers"] == n
        assert facts["driver"] not in facts["pids"] and len(facts["pids"]) == n
    assert extra or facts["local"]  # the quickstart as it is runs without Ray here


def test_a_plan_is_decided_before_anything_starts(monkeypatch):
    """Which process, how many workers and where they train, from the config and the machine
    alone (here: 4 CPUs, no Ray up, no GPU); a named cluster's pool once connected."""
    import raysim.launch.resources
    import raysim.launch.without_ray

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(raysim.launch.without_ray, "ray_is_up", lambda: False)
    monkeypatch.setattr(
        raysim.launch.resources, "local_resources", lambda: {"CPU": 4.0, "GPU": 0.0}
    )
    monkeypatch.setattr(raysim.launch.resources, "cpu_count", lambda: 4)
    local = plan_run(load_config(QUICKSTART, SHORT))
    assert local.local and local.pool_size == 1 and local.coordinator_here and local.worker_here
    ray = plan_run(load_config(QUICKSTART, [*SHORT, "runtime=ray", "workers.count=2"]))
    assert not ray.local and ray.pool_size == 2 and not ray.coordinator_here
    assert "workers: 2 actors of 1 CPU" in ray.describe() and ray.why_ray is None
    cluster = plan_run(load_config(QUICKSTART, [*SHORT, "runtime=ray"]), "10.0.0.1:6379")
    assert cluster.pool is None and "pool sized to the cluster" in cluster.describe()
    with pytest.raises(RuntimeError, match="once connected"):
        cluster.pool_size  # noqa: B018
    joined = cluster.on_cluster({"CPU": 8.0, "GPU": 0.0})
    assert joined.pool_size == 8 - COORDINATOR_CPUS and joined.resources == {"CPU": 8.0, "GPU": 0.0}
    here = plan_run(load_config(QUICKSTART, [*SHORT, "runtime=ray", "workers.count=1",
                                             "workers.transport=in_process"]))  # fmt: skip
    assert here.worker_here and "1, in the coordinator's process" in here.describe()
    with pytest.raises(ConfigError, match="workers.transport=in_process"):
        plan_run(load_config(QUICKSTART, [*SHORT, "workers.count=2",
                                          "workers.transport=in_process"]))  # fmt: skip


def test_gpus_are_counted_by_torch_where_nvml_is_there_but_fails(monkeypatch):
    """Ray counts 0 GPUs on any NVML error, and every GPU run would be refused; raysim asks
    torch then, and a private Ray starts with raysim's count. No NVIDIA driver at all is 0,
    without asking torch (a CPU run's driver imports none)."""
    import ray._private.thirdparty.pynvml as pynvml
    import torch

    import raysim.launch.private_ray
    import raysim.launch.resources

    def fails(error):
        def init():
            raise error

        return init

    asked = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: asked.append(1) or 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(pynvml, "nvmlInit", fails(pynvml.NVMLError_Unknown()))
    assert raysim.launch.resources.local_resources()["GPU"] == 2.0 and asked
    asked.clear()
    monkeypatch.setattr(pynvml, "nvmlInit", fails(pynvml.NVMLError_LibraryNotFound()))
    assert raysim.launch.resources.local_resources()["GPU"] == 0.0 and not asked
    # the private Ray gets the count: ray.init(num_gpus=...) rather than Ray's own NVML look
    monkeypatch.setattr(pynvml, "nvmlInit", fails(pynvml.NVMLError_Unknown()))
    seen = {}
    monkeypatch.setattr("ray.is_initialized", lambda: False)
    monkeypatch.setattr("ray.init", lambda **kw: seen.update(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    raysim.launch.private_ray.ensure_ray(None)
    assert seen["num_gpus"] == 2 and seen["address"] == "local"
