"""The launch package decides once (``raysim.launch``): one CPU count for every choice, a plan
that is the only hand-off, and nothing below it that recomputes the address, the pool or the
runtime."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import raysim
from raysim.config import ConfigError, load_config
from raysim.launch import plan as plan_module
from raysim.launch import preflight, private_ray, resources, without_ray
from raysim.launch.plan import plan_run
from tests.conftest import EXAMPLES

QUICKSTART = str(EXAMPLES / "quickstart.yaml")
SHORT = ["rounds=2", "tracking.enabled=false"]
#: a round of 10 clients in 10 groups: side by side on a pool of several workers (Ray), one at a
#: time on a pool of one (no Ray)
SEQUENTIAL = [*SHORT, "workers.execution=sequential"]


def fake_machine(monkeypatch, tmp_path, cores: int, quota: str | None, v1: bool = False):
    """``cores`` CPUs this process may run on, under a cgroup CPU quota (``cpu.max``'s text, or
    for ``v1`` the quota and period in microseconds)."""
    root = tmp_path / "cgroup"
    root.mkdir(exist_ok=True)
    if quota is not None and v1:
        (root / "cpu").mkdir()
        q, period = quota.split()
        (root / "cpu" / "cpu.cfs_quota_us").write_text(q + "\n")
        (root / "cpu" / "cpu.cfs_period_us").write_text(period + "\n")
    elif quota is not None:
        (root / "cpu.max").write_text(quota + "\n")
    monkeypatch.setattr(resources, "CGROUP_ROOT", root)
    monkeypatch.setattr(resources, "_own_cgroup", lambda: "")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(resources, "_visible_gpus", lambda: 0)
    monkeypatch.setattr(without_ray, "ray_is_up", lambda: False)
    monkeypatch.setattr(without_ray, "gpus_visible", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.mark.parametrize(
    ("quota", "v1", "cpus"),
    [(None, False, 16), ("max 100000", False, 16), ("100000 100000", False, 1),
     ("150000 100000", True, 1), ("50000 100000", False, 1), ("400000 100000", False, 4)],
)  # fmt: skip
def test_one_cpu_count_honours_a_container_quota(monkeypatch, tmp_path, quota, v1, cpus):
    fake_machine(monkeypatch, tmp_path, 16, quota, v1)
    assert resources.cpu_count() == cpus
    assert resources.local_resources() == {"CPU": float(cpus), "GPU": 0.0}


def test_the_no_ray_rule_the_pool_and_rays_count_agree_under_a_one_cpu_quota(monkeypatch, tmp_path):
    """On a 16-core host in a container with a 1-CPU quota: ``runtime: auto`` runs without Ray
    (a pool of one worker trains one group at a time), ``runtime: ray`` sizes a pool of one, and
    the private Ray is started with that one CPU. Without the quota, 16 CPUs: Ray, for a pool
    that trains the round's groups side by side."""
    fake_machine(monkeypatch, tmp_path, 16, None)
    many = plan_run(load_config(QUICKSTART, SEQUENTIAL))
    assert not many.local and many.pool_size > 1 and "on 16 CPUs" in many.why["runtime"]
    fake_machine(monkeypatch, tmp_path, 16, "100000 100000")
    one = plan_run(load_config(QUICKSTART, SEQUENTIAL))
    assert one.local, one.describe()
    assert "runtime=auto" in one.describe().splitlines()[1]
    on_ray = plan_run(load_config(QUICKSTART, [*SEQUENTIAL, "runtime=ray"]))
    assert on_ray.pool_size == 1 and on_ray.resources["CPU"] == 1.0
    started = {}
    monkeypatch.setattr("ray.is_initialized", lambda: False)
    monkeypatch.setattr("ray.init", lambda **kw: started.update(kw))
    private_ray.ensure_ray(target=on_ray.target, resources=on_ray.resources)
    assert started["num_cpus"] == 1 and started["address"] == "local"


def fail_if_called(monkeypatch) -> list[str]:
    """Every function that resolves the address, counts the machine, sizes the pool, chooses
    the runtime or checks a run, wherever a raysim module holds it (its own module, or a name
    another imported): each raises once patched here, and says which was called."""
    import importlib
    import sys

    # a module a run imports lazily would otherwise bind a patched name for good: import the
    # ones that hold a deciding function by name first, so the patch finds (and undoes) theirs
    for name in (
        "raysim.launch.session",
        "raysim.actors.coordinator_actor",
        "raysim.cli.run",
        "raysim.launch.trials",
        "raysim.sweeps.trial",
        "raysim.launch.store_choice",
    ):
        importlib.import_module(name)  # fmt: skip
    called: list[str] = []
    targets = [
        getattr(module, name)
        for module, names in [
            (private_ray, ["ray_address", "check_reachable"]),
            (resources, ["plan_pool_size", "plan_resources", "local_resources", "cpu_count"]),
            (without_ray, ["needs_ray", "runs_without_ray", "choose_runtime", "auto_prefers_ray"]),
            (plan_module, ["plan_run", "_resources_before_start"]),
            (preflight, ["preflight"]),
        ]
        for name in names
    ]

    def boom(f):
        def failing(*a, **k):
            called.append(f.__qualname__)
            raise AssertionError(f"{f.__module__}.{f.__qualname__} was called after planning")

        return failing

    for module in [m for name, m in sys.modules.items() if name.startswith("raysim.")]:
        for name, value in list(vars(module).items()):
            if any(value is f for f in targets):
                monkeypatch.setattr(module, name, boom(value))
    return called


def test_a_run_without_ray_follows_its_plan_and_decides_nothing_again(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    # runtime=local: without Ray even where the session's Ray is up in this process
    plan = plan_run(load_config(QUICKSTART, [*SHORT, "runtime=local"]))
    assert plan.local and plan.checked
    called = fail_if_called(monkeypatch)
    result = raysim.run(plan=plan)
    assert not called and result.plan == plan.describe()


@pytest.mark.slow
def test_a_run_on_ray_follows_its_plan_and_decides_nothing_again(ray_cluster, monkeypatch):
    """On the session's Ray: the pool was sized from its resources when planned; the run
    starts that many workers and asks nothing again."""
    plan = plan_run(load_config(QUICKSTART, [*SEQUENTIAL, "runtime=ray", "workers.count=2"]))
    assert not plan.local and plan.pool_size == 2
    called = fail_if_called(monkeypatch)
    started = {}
    result = raysim.run(plan=plan, on_start=lambda s: started.update(n=len(s.workers())))
    assert not called and started["n"] == 2 and result.plan == plan.describe()


def test_a_plan_made_for_one_address_is_not_run_against_another():
    plan = plan_run(load_config(QUICKSTART, SHORT))
    with pytest.raises(ConfigError, match="plan was made for Ray at local, not 10.0.0.1:6379"):
        raysim.run(plan=plan, address="10.0.0.1:6379")


def test_the_dry_run_does_not_announce_batching_the_model_may_refuse():
    text = plan_run(load_config(QUICKSTART, SHORT)).describe()
    clients = next(line for line in text.splitlines() if line.startswith("clients: "))
    assert "where the built model allows" in clients and "one after another" in clients
    batched = plan_run(load_config(QUICKSTART, [*SHORT, "workers.execution=batched"]))
    assert "(workers.execution=batched)" in batched.describe()


#: a fresh driver plans for the cluster, then follows that plan with every deciding function
#: made to fail, and prints the plan it followed
FOLLOW_ON_CLUSTER = """
import sys
import pytest
import raysim
from raysim.config import load_config
from raysim.launch.plan import plan_run, size_on_cluster
from tests.test_launch import fail_if_called

plan = size_on_cluster(plan_run(load_config(sys.argv[1], sys.argv[3:]), sys.argv[2]))
patch = pytest.MonkeyPatch()
called = fail_if_called(patch)
result = raysim.run(plan=plan)
assert not called, called
print("PLAN<<" + result.plan + ">>")
"""


@pytest.mark.slow
@pytest.mark.matrix  # a two-node loopback cluster of its own (about a minute)
def test_the_plan_a_dry_run_prints_for_a_cluster_address_is_the_plan_followed(tmp_path):
    import sys

    from tests.conftest import ROOT
    from tests.loopback import loopback_cluster

    overrides = [*SEQUENTIAL, "runtime=ray"]
    with loopback_cluster(head_cpus=2, worker_cpus=2, worker_gpus=0) as cluster:
        env_cwd = {"cwd": tmp_path}
        raysim_cli = str(Path(sys.executable).with_name("raysim"))
        dry = cluster.run(
            raysim_cli, "run", QUICKSTART, *overrides, "--dry-run", "--address", cluster.gcs,
            **env_cwd,
        )  # fmt: skip
        assert dry.returncode == 0, dry.stderr[-3000:]
        printed = dry.stdout.removeprefix("dry run: ").rstrip("\n")
        assert f"runtime: Ray at {cluster.gcs}" in printed
        assert "workers: 4 actors of 1 CPU (workers.count=auto" in printed, printed
        cluster.env["PYTHONPATH"] = str(ROOT)
        out = cluster.run(
            sys.executable, "-c", FOLLOW_ON_CLUSTER, QUICKSTART, cluster.gcs, *overrides,
            **env_cwd,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split("PLAN<<", 1)[1].split(">>", 1)[0] == printed
