"""Leave-one-task-out driver: one parent run, a child per (held-out family, method), a table."""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from raysim.sweeps.protocols import leave_one_out
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.slow

TINY = [
    "data.text.n_train=16",
    "data.text.n_test=4",
    "model.llama.hidden_size=32",
    "model.llama.intermediate_size=64",
    "model.llama.num_hidden_layers=1",
    "rounds=1",
    "eval.max_new_tokens=3",
    "eval.id=false",
]


@pytest.mark.matrix  # suite time: a FedOA run per held-out task
def test_leave_one_task_out_table_and_runs(ray_cluster, mlflow_uri):
    out = leave_one_out(
        EXAMPLES / "fedoa" / "smoke.yaml",
        TINY,
        settings=["sentiment", "reading_comprehension"],
        methods=["fedit"],  # one method keeps it quick; the table's shape is tested offline too
    )
    assert set(out.table) == {"fedit"}
    assert all(math.isfinite(out.table[m][s]) for m in out.table for s in out.settings)
    assert out.markdown().count("\n") == 3 and "Average" in out.markdown()
    client = MlflowClient(mlflow_uri)
    parent = client.get_run(out.parent_run_id)
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{out.parent_run_id}'"
    )
    assert len(children) == 2
    assert {(c.data.tags["held_out"], c.data.tags["method"]) for c in children} == {
        (s, "fedit") for s in out.settings
    }
    names = {a.path for a in client.list_artifacts(out.parent_run_id)}
    assert {"table.csv", "table.md", "table.png"} <= names
    # the held-out family really changes the data: different OOD sets, different losses
    losses = {s: out.results[(s, "fedit")].metrics["ood_loss"] for s in out.settings}
    assert losses["sentiment"] != losses["reading_comprehension"]


def test_bad_method_fails_before_any_run(ray_cluster):
    from raysim.config import ConfigError

    with pytest.raises(ConfigError, match="unknown algorithm 'fedoaa'"):
        leave_one_out(EXAMPLES / "fedoa" / "smoke.yaml", TINY, methods=["fedoaa"])


@pytest.mark.matrix  # the same protocol code as leave-one-task-out, through the CLI
def test_lodo_cli_runs_a_held_out_domain(ray_cluster, capsys):
    from raysim.cli import main

    argv = ["lodo", str(EXAMPLES / "fedoa" / "smoke.yaml"), *TINY, "--methods", "fedit"]
    assert main([*argv, "--dry-run"]) == 0  # both domains' configs validate
    assert "2 runs validated" in capsys.readouterr().out
    code = main([*argv, "--held-out", "d2"])  # one run keeps it quick; loto runs two above
    out = capsys.readouterr().out
    assert code == 0
    assert "leave-one-domain-out" in out and "d2" in out
