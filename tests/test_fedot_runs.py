"""FedOT through the runtime: resume, an actor per client (invariant 10) and the CI smoke through
``raysim run`` (FedOT and FedAvg on affine-shifted digits, 1 and 2 workers, a killed worker and a
resumed coordinator), and exact centring's round-as-one-batch through a killed worker."""

from __future__ import annotations

import re

import numpy as np
import pytest

import raysim
from raysim.config import load_config
from tests.conftest import ROOT, fresh_cli, resumed_through_checkpoint

from .test_fedot import fedot_cfg, heads, run

MINI = ROOT / "examples" / "fedot" / "mini.yaml"


def same_states(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for c in a:
        np.testing.assert_array_equal(heads(a[c]), heads(b[c]))
        np.testing.assert_array_equal(a[c]["psi.a"], b[c]["psi.a"])
        np.testing.assert_array_equal(a[c]["psi.b"], b[c]["psi.b"])


def test_fedot_resumes_bit_identically_maps_heads_and_server_mean_included():
    cfg = fedot_cfg(per_round=3, rounds=4)
    full = run(cfg)
    resumed, saved = resumed_through_checkpoint(cfg, 2)
    assert "psi.a" in saved["client_states"][0]
    assert resumed.digest() == full.digest()
    same_states(resumed.materialized_states(), full.materialized_states())
    np.testing.assert_array_equal(resumed.strategy.vbar, full.strategy.vbar)


@pytest.mark.matrix  # suite time: per-client actors run fast in tests/test_client_state.py
def test_i10_an_actor_per_client_gives_the_in_process_result(ray_cluster):
    """Clients served by their own actors give the same weights, maps and heads as the
    in-process run (two pooled workers serving clients in whatever order: the CLI smoke)."""
    cfg = fedot_cfg(n=4, per_round=3, rounds=3)
    reference = run(load_config(cfg.to_dict(), ["workers.execution=sequential"]))
    res = raysim.run(cfg.to_dict(), ["workers.count=per_client", "workers.num_cpus=0.1"])
    assert res.weights_digest == reference.digest()
    same_states(res.client_states, reference.materialized_states())


SMOKE = [
    "rounds=3",
    "clients.num=8",
    "clients.per_round=8",
    "data.digits.train_size=240",
    "tracking.enabled=false",
]


@pytest.mark.slow
@pytest.mark.matrix  # suite time: a long end-to-end run through the CLI
def test_the_fedot_example_gives_the_in_process_digest_on_2_workers_through_a_kill_and_a_resume(
    tmp_path,
):
    """``raysim run examples/fedot/mini.yaml`` on two workers, one killed in round 1 and the
    coordinator killed before round 2 (its successor resumes from the checkpoint of round 2):
    the digest of the uninterrupted in-process run."""
    faults = ["checkpoint.every=1", f"checkpoint.dir={tmp_path / 'ckpt'}"]
    faults += ["faults.kill_worker.round=1", "faults.kill_worker.worker=1"]
    faults += ["faults.kill_coordinator.round=2", "workers.group_size=3"]  # both workers busy
    out = fresh_cli(["run", str(MINI), *SMOKE, "workers.count=2", *faults], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "worker 1 restarted" in said and "took over from the checkpoint of round 2" in said
    digest = re.search(r"weights sha256: (\w+)", out.stdout).group(1)
    assert run(load_config(MINI, [*SMOKE, "workers.group_size=3"])).digest() == digest


@pytest.mark.matrix  # suite time: a killed worker's digest runs fast in tests/test_runtime.py
def test_exact_centring_on_2_workers_through_a_killed_worker_gives_the_in_process_digest(
    ray_cluster,
):
    """``dual_centering: exact`` sends each round to one worker as one batch; that worker dies in
    round 1, Ray restarts it and the batch runs again: weights, maps and heads as in-process."""
    cfg = fedot_cfg(n=4, rounds=3, dual_centering="exact")
    reference = run(cfg)
    kill = ["workers.count=2", "faults.kill_worker.round=1", "faults.kill_worker.worker=0"]
    res = raysim.run(cfg.to_dict(), kill)
    assert sum(h["worker_restarts"] for h in res.history) == 1
    assert res.weights_digest == reference.digest()
    same_states(res.client_states, reference.materialized_states())


@pytest.mark.matrix  # suite time: FedOT on Ray runs fast in the diverging run below
def test_fedavg_on_the_fedot_example_gives_the_in_process_digest_on_2_workers(ray_cluster):
    overrides = [*SMOKE, "algorithm={name: fedavg}"]
    reference = run(load_config(MINI, overrides)).digest()
    assert raysim.run(str(MINI), [*overrides, "workers.count=2"]).weights_digest == reference


def test_a_diverging_run_stops_failed_and_records_the_round_and_the_cause(ray_cluster, mlflow_uri):
    from mlflow.tracking import MlflowClient

    from raysim.algorithms.base import Diverged

    cfg = fedot_cfg(n=4, rounds=20, lr_map=50.0, lr_ascent=5.0, **{"lambda": 4.0})
    wire = {**cfg.to_dict(), "tracking": {"experiment": "diverging"}}
    with pytest.raises(Diverged, match=r"round \d+: client \d+") as caught:
        raysim.run(wire, ["workers.count=1"])
    client = MlflowClient(mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("diverging").experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags["raysim.error"] in str(caught.value)
    assert int(run.data.tags["raysim.diverged_round"]) < 20
