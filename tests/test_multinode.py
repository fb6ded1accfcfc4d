"""A two-node Ray cluster (``ray.cluster_utils.Cluster``): a run spreads its workers over both
nodes and gives the single-node weights; a Tune sweep runs there, and its trial with the run's
values gives them too; with a sqlite store (local to the driver's node) every coordinator is kept
on the driver's node and every run lands in it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

import raysim
from raysim.actors.local import local_core
from raysim.tracking.store import NODE_TAG
from tests.conftest import ROOT, tiny

pytestmark = pytest.mark.slow


@pytest.mark.matrix  # suite time: a two-node `ray start` cluster of its own
def test_two_node_cluster_run_and_sweep(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.multinode_run", store],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["nodes"]) == 2  # one worker (1 CPU) per node
    local = local_core(raysim.load_config(tiny(rounds=3, tracking={"enabled": False})))
    while not local.done:  # the same run in this one process, no Ray
        local.step()
    assert out["digest"] == local.digest()
    # the trial with the run's own values (lr 0.1) is that run: Tune changes nothing it computes
    assert out["trials"]["0.1"] == local.digest() != out["trials"]["0.05"]

    client = MlflowClient(store)
    run = client.get_run(out["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags[NODE_TAG] == out["head"]
    sweep = client.get_experiment_by_name("mn-sweep")
    children = client.search_runs(
        [sweep.experiment_id], f"tags.`mlflow.parentRunId` = '{out['parent']}'"
    )
    assert len(children) == 2
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags[NODE_TAG] == out["head"]  # pinned beside the store
        assert len(client.get_metric_history(child.info.run_id, "accuracy")) == 3
