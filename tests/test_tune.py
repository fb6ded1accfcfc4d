"""``raysim tune``: the ``tune:`` section, the search space through the run's own schema, and a
real sweep on Ray with ASHA, MLflow parent and child runs, and no actor left behind."""

from __future__ import annotations

import time

import pytest
from mlflow.tracking import MlflowClient

import raysim
from raysim.config import ConfigError, load_config
from raysim.sweeps.space import TuneSection
from raysim.sweeps.tuner import check_space, sweep_section
from tests.conftest import EXAMPLES, sweep_cfg, tiny


def section(**kw):
    return TuneSection.model_validate({"space": {"local.lr": {"grid": [0.1]}}, **kw})


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"space": {"local.lr": {"logunifrom": [1e-3, 1e-1]}}}, "did you mean 'loguniform'"),
        ({"space": {"local.lr": {"uniform": [1, 1]}}}, "low < high"),
        ({"space": {"local.lr": {"loguniform": [0, 1]}}}, "positive low bound"),
        ({"space": {"local.lr": {"grid": [0.1], "choice": [0.2]}}}, "exactly one"),
        ({"space": {"local.lr": {"uniform": [0.1, 1]}}, "search": "grid"}, "use search=random"),
        ({"space": {"local.lr": {"grid": [0.1]}}, "metrc": "loss"}, "did you mean 'metric'"),
        ({"space": {}}, "names no key"),
    ],
)
def test_the_tune_section_is_strict(raw, needle):
    with pytest.raises(ValueError, match=needle):
        TuneSection.model_validate(raw)


def test_a_config_tune_section_validates_with_the_run(tmp_path):
    cfg = load_config(
        tiny(tune={"space": {"local.lr": {"loguniform": [1e-3, 1e-1]}}, "scheduler": "asha"})
    )
    assert sweep_section(cfg).space["local.lr"].kind == "loguniform"
    with pytest.raises(ConfigError, match="tune.*did you mean 'scheduler'"):
        load_config(tiny(tune={"space": {"local.lr": {"grid": [0.1]}}, "schedular": "asha"}))
    with pytest.raises(ConfigError, match="needs a tune: section"):
        sweep_section(load_config(tiny()))
    # the section never changes what a run computes: `raysim run` ignores it, resume too
    from raysim.state.checkpoint import config_hash

    assert config_hash(cfg) == config_hash(load_config(tiny()))


@pytest.mark.parametrize(
    ("space", "needle"),
    [
        ({"local.lrr": {"grid": [0.1]}}, r"tune.space.local.lrr = 0.1: .*did you mean 'lr'"),
        ({"clients.per_round": {"randint": [5, 500]}}, r"clients.per_round = 499: .*exceeds"),
        ({"algorithm.buffer_size": {"grid": [5]}}, "algorithm.buffer_size"),
    ],
)
def test_a_swept_key_or_value_the_run_refuses_fails_before_anything_starts(space, needle):
    base = load_config(tiny()).to_dict()
    with pytest.raises(ConfigError, match=needle):
        check_space(base, TuneSection.model_validate({"space": space}))


# --------------------------------------------------------------------------- on Ray
@pytest.mark.slow
@pytest.mark.matrix  # suite time (~30 s); CI runs the matrix tier too
def test_a_sweep_runs_trials_as_raysim_runs_and_resumes_after_ctrl_c(
    ray_cluster, mlflow_uri, tmp_path
):
    """Two trials under ASHA on the test cluster, one at a time. Ctrl-C (a SIGINT) after the
    first round: Tune saves its state and the sweep's run is KILLED. ``resume=`` then finishes
    the sweep under the same parent run, with the live display back. Every trial is a raysim
    run with its own MLflow run under the sweep's; none is left RUNNING; no actor outlives the
    sweep."""
    import json
    import os
    import signal
    from pathlib import Path

    import ray._private.state as ray_state  # the GCS actor table: ray.util.state needs a dashboard

    from raysim.sweeps.tuner import SWEEP_FILE, SweepInterrupted

    cfg = sweep_cfg(
        "tune-test",
        {
            "space": {"local.lr": {"grid": [0.0001, 0.3]}},
            "scheduler": "asha",
            "asha": {"grace_period": 1, "reduction_factor": 2},
            "max_concurrent_trials": 1,
        },
    )

    def ctrl_c(trial: str, result: dict) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends; Tune's handler takes it

    with pytest.raises(SweepInterrupted) as stop:
        raysim.tune(cfg, storage=tmp_path / "tune", on_result=ctrl_c)
    parent = json.loads((Path(stop.value.path) / SWEEP_FILE).read_text())["parent_run_id"]
    client = MlflowClient(mlflow_uri)
    assert client.get_run(parent).info.status == "KILLED"

    shown: list[int] = []
    out = raysim.tune(cfg, resume=stop.value.path, on_result=lambda t, r: shown.append(r["round"]))
    assert shown  # the live display sees the resumed sweep
    assert out.parent_run_id == parent
    assert len(out.table) == 2
    assert {r["status"] for r in out.table} <= {"finished", "stopped early"}
    assert out.best_params["local.lr"] == 0.3
    assert out.best_config["local"]["lr"] == out.best_params["local.lr"]
    parent_run = client.get_run(parent)
    assert parent_run.info.status == "FINISHED"
    names = {a.path for a in client.list_artifacts(parent)}
    assert {"trials.csv", "trials.md", "best_config.yaml", "learning_curves.png"} <= names
    for row in out.table:
        run = client.get_run(row["run_id"])
        assert run.data.tags["mlflow.parentRunId"] == parent
        if row["status"] == "finished":
            assert run.info.status == "FINISHED"
        else:
            assert run.info.status == "KILLED"
            assert run.data.tags["raysim.stopped_early"] == "true"
    children = client.search_runs(
        [parent_run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'"
    )  # a trial that Ctrl-C cut short ran again on resume: its first run is not left RUNNING
    assert {c.info.status for c in children} <= {"FINISHED", "KILLED"}
    # a finished trial's weights equal `raysim run`'s: tests/test_multinode.py (on two nodes)
    assert all(r["weights_digest"] for r in out.table if r["status"] == "finished")
    alive = [a["ActorClassName"] for a in ray_state.actors().values() if a["State"] == "ALIVE"]
    assert not [a for a in alive if a in ("Coordinator", "Worker", "RunTrial")], alive


def test_a_trial_that_cannot_fit_is_refused_saying_what_it_needs():
    from raysim.launch.resources import ResourceError
    from raysim.launch.trials import TRIAL_CPU, describe_sweep, trial_bundles

    cfg = load_config(tiny(workers={"count": 2, "num_cpus": 1.0}))
    bundles = trial_bundles(cfg, {"CPU": 4.0})
    assert bundles[0] == {"CPU": TRIAL_CPU} and bundles[2:] == [{"CPU": 1.0}] * 2
    with pytest.raises(ResourceError, match=r"2 worker\(s\) .* do not fit .* at most 1 fit"):
        trial_bundles(cfg, {"CPU": 2.0})
    space = TuneSection.model_validate({"space": {"local.lr": {"grid": [0.1, 0.2, 0.3]}}})
    assert "3 trial(s)" in describe_sweep(cfg, space, bundles, {"CPU": 4.0})
    assert "1 side by side" in describe_sweep(cfg, space, bundles, {"CPU": 4.0})


@pytest.mark.parametrize(
    ("worker", "overrides", "samples", "here"),
    [
        ("auto", {}, 2, True),  # 4 trials, 3 side by side: processes are reused
        ("auto", {}, 1, False),  # 2 trials, each in a fresh process: the worker an actor
        ("auto", {"max_concurrent_trials": 1}, 1, True),
        ("here", {}, 1, True),
        ("actor", {}, 2, False),
        ("here", {"workers": {"count": 2, "num_cpus": 0.5}}, 2, False),
        ("here", {"workers": {"count": 1, "num_cpus": 0.5, "num_gpus": 0.25}}, 2, False),
        ("here", {"faults": {"kill_worker": {"round": 1, "worker": 0}}}, 2, False),
        ("here", {"faults": {"kill_coordinator": {"round": 1}}}, 2, False),
    ],
)
def test_which_sweeps_train_the_worker_in_the_trial_process(worker, overrides, samples, here):
    from raysim.launch.trials import trains_here, trial_bundles

    tune = {"max_concurrent_trials": overrides.pop("max_concurrent_trials", None)}
    cfg = load_config(tiny(**{"workers": {"count": 1, "num_cpus": 0.5}, **overrides}))
    space = TuneSection.model_validate(
        {"space": {"local.lr": {"grid": [0.1, 0.2]}}, "worker": worker, "num_samples": samples}
        | tune
    )
    total = {"CPU": 2.0, "GPU": 1.0}
    bundles = trial_bundles(cfg, total)
    assert trains_here(cfg, space, bundles, total) is here
    # pinned to the head (a node-local store on a cluster): auto keeps worker actors
    assert trains_here(cfg, space, bundles, total, pinned=True) is (here and worker == "here")


def test_workers_transport_in_process_trains_every_trial_in_its_process():
    """``workers.transport: in_process``: every trial trains here, even where ``auto`` would
    keep an actor (pinned to the head included); ``tune.worker=actor`` or a config that cannot
    train in process is one ConfigError."""
    from raysim.launch.trials import trains_here, trial_bundles

    def decide(worker: str, **overrides) -> bool:
        workers = {"count": 1, "num_cpus": 0.5, "transport": "in_process"}
        cfg = load_config(tiny(**{"workers": workers, **overrides}))
        section = TuneSection.model_validate(
            {"space": {"local.lr": {"grid": [0.1, 0.2]}}, "worker": worker}
        )
        total = {"CPU": 2.0}
        return trains_here(cfg, section, trial_bundles(cfg, total), total, pinned=True)

    assert decide("auto") and decide("here")
    with pytest.raises(ConfigError, match="tune.worker auto or here"):
        decide("actor")
    with pytest.raises(ConfigError, match="workers.transport=in_process"):
        decide("auto", faults={"kill_coordinator": {"round": 1}})


def test_a_trial_that_trains_its_worker_holds_the_worker_share_in_its_own_bundle():
    from raysim.launch.trials import TRIAL_CPU, trial_bundles, worker_in_trial

    cfg = load_config(tiny(workers={"count": 1, "num_cpus": 0.5}))
    assert trial_bundles(cfg, {"CPU": 2.0}) == [{"CPU": TRIAL_CPU}, {"CPU": 0.001}, {"CPU": 0.5}]
    assert worker_in_trial(trial_bundles(cfg, {"CPU": 2.0})) == [
        {"CPU": pytest.approx(TRIAL_CPU + 0.5)},
        {"CPU": 0.001},
    ]


@pytest.mark.matrix  # suite time (~17 s on 2 vCPUs): the fast suite's budget
@pytest.mark.slow
def test_asha_stops_a_trial_at_its_rung_and_the_trial_runs_no_round_past_it(
    ray_cluster, mlflow_uri, tmp_path
):
    """A trial's rounds run ahead of Tune's controller (``raysim.sweeps.ahead``) but wait at
    each ASHA rung for the controller's answer: the trial that ASHA stops at its rung (round 2
    of 4) has logged exactly the rounds it reported, and its run is KILLED there."""
    cfg = sweep_cfg(
        "tune-rung",
        {
            "space": {"local.lr": {"grid": [0.3, 0.0001]}},
            "scheduler": "asha",
            "asha": {"grace_period": 2, "reduction_factor": 2},
            "max_concurrent_trials": 1,
        },
        rounds=4,
    )
    shown: dict[str, list[int]] = {}
    out = raysim.tune(
        cfg,
        storage=tmp_path / "tune",
        on_result=lambda t, r: shown.setdefault(t, []).append(int(r["round"])),
    )
    rows = {row["local.lr"]: row for row in out.table}
    assert (rows[0.3]["status"], rows[0.3]["rounds"]) == ("finished", 4)
    assert (rows[0.0001]["status"], rows[0.0001]["rounds"]) == ("stopped early", 2)
    assert sorted(len(r) for r in shown.values()) == [2, 4]  # every round reported, in order
    assert all(r == sorted(r) for r in shown.values())
    client = MlflowClient(mlflow_uri)
    for row in rows.values():
        logged = client.get_metric_history(row["run_id"], "round_wall_s")
        assert len(logged) == row["rounds"], (row, [m.step for m in logged])
    assert client.get_run(rows[0.0001]["run_id"]).info.status == "KILLED"


IDLE_PROBE = """
import json, subprocess, sys, time
import raysim
from mlflow.tracking import MlflowClient
from raysim.launch.private_ray import ensure_ray

cfg, store = json.loads(sys.argv[1]), sys.argv[2]
ensure_ray()  # a private Ray, as `raysim tune` starts one
time.sleep(2.0)  # the worker processes Ray starts with the node, one per CPU, are up
ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
rows = [line.split(None, 1) for line in ps.splitlines()[1:]]
idle = [int(row[0]) for row in rows if len(row) == 2 and row[1].startswith("ray::IDLE")]
pids = []
out = raysim.tune(cfg, storage=store, on_result=lambda t, r: pids.append(r["pid"]))
client = MlflowClient(cfg["tracking"]["uri"])
path = client.download_artifacts(out.table[0]["run_id"], "placement.json", store)
worker = json.loads(open(path).read())["workers"][0]["pid"]
print(json.dumps({"idle": idle, "trial": pids[0], "worker": worker}))
"""


@pytest.mark.slow
@pytest.mark.matrix  # suite time: a start-up speed property
def test_a_trial_and_its_worker_start_in_processes_ray_kept_idle(tmp_path):
    """In a fresh private Ray, a trial's process takes a worker process that Ray started with
    the node, as a plain run's actors do, instead of waiting for a new one: Tune's own runtime
    environment for its trainables (``PL_DISABLE_FORK``), which no such process has, is not
    given to raysim's (``tuner._plain_trainable``)."""
    import json
    import os
    import subprocess
    import sys

    cfg = sweep_cfg(
        "tune-idle",
        {"space": {"local.lr": {"grid": [0.1]}}, "worker": "actor"},
        rounds=1,
        uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )
    env = {**os.environ, "RAY_ADDRESS": "local"}
    proc = subprocess.run(
        [sys.executable, "-c", IDLE_PROBE, json.dumps(cfg), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(seen["idle"]) >= 2, seen
    # the worker too, mostly; Ray now and then gives it a new process even so
    assert seen["trial"] in seen["idle"], seen


def test_a_worker_that_loads_the_trial_module_starts_no_worker(ray_cluster):
    """A worker runs in its trial's placement group, and loads ``raysim.sweeps.trial`` where it
    reads the trial's actor handle (a link to the trial's coordinator). That module starts a
    trial's published workers as it loads (``raysim.sweeps.early``); in a worker it starts none
    (before, each linked trial had a second worker, which no run used)."""
    import ray
    import ray._private.state as ray_state
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from raysim.actors.pool import WorkerLaunch, _worker_class
    from raysim.sweeps import early

    def workers() -> int:
        return sum(
            a["ActorClassName"] == "Worker" and a["State"] != "DEAD"
            for a in ray_state.actors().values()
        )

    launch = WorkerLaunch.for_config(load_config(tiny(workers={"count": 1, "num_cpus": 0.5})), 1)
    pg = placement_group([{"CPU": 0.5}, {"CPU": 0.5}])
    ray.get(pg.ready())
    before = workers()
    early.publish(launch)
    try:
        strategy = PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
        worker = _worker_class().options(**launch.options, scheduling_strategy=strategy).remote()
        loaded = worker.__ray_call__.remote(
            lambda self: __import__("raysim.sweeps.trial").__name__ and early._started
        )
        assert ray.get(loaded) == (None, [])
        time.sleep(0.5)  # the actor table sees a new actor within this
        assert workers() == before + 1
        ray.kill(worker)
    finally:
        early.publish(None)
        remove_placement_group(pg)


@pytest.mark.matrix  # suite time: trials as raysim runs are checked by the Ctrl-C sweep above
def test_a_trials_workers_start_as_its_process_loads_and_train_what_raysim_run_does(
    ray_cluster, tmp_path
):
    """Two trials side by side (``tune.worker=auto``: worker actors): each trial's process
    starts its worker as it loads the trainable (``raysim.sweeps.early``), before Tune's own
    import; the run takes that worker (placement says ``early``) and trains the weights
    ``raysim run`` trains with the same values. A trial whose launch differs gets its own."""
    import json

    from raysim.actors.pool import WorkerLaunch
    from raysim.sweeps import early

    cfg = sweep_cfg(
        "tune-early",
        {"space": {"local.lr": {"grid": [0.05, 0.1]}}, "worker": "actor"},
    )
    out = raysim.tune(cfg, storage=tmp_path / "tune")
    client = MlflowClient()
    for row in out.table:
        path = client.download_artifacts(row["run_id"], "placement.json", str(tmp_path))
        workers = json.loads(open(path).read())["workers"]
        assert [(w["mode"], w["early"]) for w in workers] == [("actor", True)]
        alone = raysim.run(load_config(cfg, [f"local.lr={row['local.lr']}"]))
        assert row["weights_digest"] == alone.weights_digest
    # a launch that is not the run's: its workers end, and the run starts its own
    launch = WorkerLaunch.for_config(load_config(tiny()), 1)
    other = WorkerLaunch(launch.options, launch.threads + 1, launch.count)
    early._started = (other, [other.start()])
    assert early.take(launch) == [] and early.take(launch) == []
    early._started = (launch, [launch.start()])  # a run with no worker actors ends them too
    assert early.take(None) == []


@pytest.mark.slow
@pytest.mark.matrix  # suite time, as the test above
def test_trials_that_train_their_worker_in_process_match_raysim_run(ray_cluster, tmp_path):
    """Two trials one at a time (``tune.worker=auto``: the second reuses the first's process):
    no worker actor starts, each trial's placement says its worker is in process, and each
    trial's weights equal ``raysim run``'s with the same values."""
    import json

    import ray._private.state as ray_state

    from raysim.launch.trials import trial_lines

    def workers_started() -> int:
        return sum(a["ActorClassName"] == "Worker" for a in ray_state.actors().values())

    cfg = sweep_cfg(
        "tune-here",
        {"space": {"local.lr": {"grid": [0.05, 0.1]}}, "max_concurrent_trials": 1},
    )
    planned = raysim.tune(cfg, dry_run=True).splitlines()[1:]  # what every trial is to do
    assert "trial workers: 1, in the coordinator's process (workers.count=1)" in planned
    before = workers_started()
    out = raysim.tune(cfg, storage=tmp_path / "tune")
    assert workers_started() == before
    client = MlflowClient()
    for row in out.table:
        path = client.download_artifacts(row["run_id"], "placement.json", str(tmp_path))
        assert [w["mode"] for w in json.loads(open(path).read())["workers"]] == ["in_process"]
        path = client.download_artifacts(row["run_id"], "plan.json", str(tmp_path))
        assert trial_lines("\n".join(json.loads(open(path).read())["plan"])) == planned
        alone = raysim.run(load_config(cfg, [f"local.lr={row['local.lr']}"]))
        assert row["weights_digest"] == alone.weights_digest
    with pytest.raises(ConfigError, match="set tune.worker=actor"):
        raysim.RunSession(load_config(tiny()), coordinator_here=True, worker_here=True)


def test_resuming_what_is_not_a_sweep_is_a_one_line_error(tmp_path, capsys):
    from raysim.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("rounds: 2\ntune: {space: {local.lr: {grid: [0.1]}}}\n")
    assert main(["tune", str(cfg), "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a raysim sweep's directory" in err[0]


def test_a_trial_set_up_and_removed_before_its_first_step_leaves_no_run(tmp_path):
    """With ``reuse_actors``, Tune may set up a process for a trial and remove it unstepped,
    giving the trial to a process it kept (``TuneController._maybe_reuse_cached_actor``). The
    run starts at the first step, so that process leaves no KILLED child run with no round in
    MLflow (seen in 1 of 4 two-node sweeps before: a trial with two child runs)."""
    from raysim.sweeps.trial import RunTrial

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    trial = RunTrial.__new__(RunTrial)  # the trainable as Tune's actor holds it, without Tune
    trial.setup(
        {"local.lr": 0.05},
        base=tiny(tracking={"uri": store, "experiment": "s"}),
        parent_run_id=None,
        metric="accuracy",
    )
    assert trial.session is None
    trial.cleanup()
    exp = MlflowClient(store).get_experiment_by_name("s")
    assert exp is None or not MlflowClient(store).search_runs([exp.experiment_id])


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["rounds=3"], r"grace_period=6 is past a trial's last round \(rounds=3\)"),
        (["tune.asha.max_t=4"], r"\(tune.asha.max_t=4\): set tune.asha.grace_period to at most 4"),
    ],
)
def test_an_asha_grace_period_past_the_last_round_is_a_config_error(overrides, needle):
    """Ray's ASHA asserts ``grace_period <= max_t`` (a traceback); raysim says it first, in the
    config's own words, before anything starts (a dry run included)."""
    cfg = load_config(EXAMPLES / "tune-async.yaml", overrides)
    with pytest.raises(ConfigError, match=needle):
        sweep_section(cfg)
    with pytest.raises(ConfigError, match=needle):
        raysim.tune(cfg, dry_run=True)
    sweep_section(
        load_config(EXAMPLES / "tune-async.yaml", [*overrides, "tune.asha.grace_period=3"])
    )


def test_a_metric_no_run_reports_is_named_with_what_they_do_report():
    """A misspelt ``tune.metric`` runs every trial to its end, each scoring NaN; the sweep then
    ends with one line naming the metrics the runs did report, not a traceback."""
    from types import SimpleNamespace

    from raysim.sweeps.tuner import _check_metric_reported

    grid = [
        SimpleNamespace(
            metrics={"accuracy": 0.5, "loss": 1.2, "acuracy": float("nan"), "round": 3}
        ),
        SimpleNamespace(metrics={"accuracy": 0.6, "loss": 1.1, "training_iteration": 3}),
    ]
    with pytest.raises(
        ConfigError, match=r"did you mean 'accuracy'\?\); they report accuracy, loss;"
    ):
        _check_metric_reported(grid, "acuracy", "p1")
    _check_metric_reported(grid, "loss", "p1")  # reported: nothing to say
