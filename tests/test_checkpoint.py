"""Checkpoint every N rounds and resume a whole run (docs/running.md): a run interrupted and resumed
ends bit-identical to one that never stopped, and its MLflow run reads as one run."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient

import raysim
from raysim.actors.coordinator_core import TIMING_METRICS, CoordinatorCore
from raysim.actors.executor import InProcessExecutor
from raysim.actors.worker import ClientRunner
from raysim.config import ConfigError, load_config
from raysim.data import build_federated_dataset
from raysim.sim.build import initial_weights
from raysim.state import checkpoint, checkpoint_files
from raysim.state.checkpoint import ResumeError, prepare_resume
from raysim.tracking import artifacts
from tests.conftest import EXAMPLES, tiny

WALL_CLOCK = TIMING_METRICS


def deterministic(history):
    """A comparable text of a history without its wall-clock keys (repr: NaN equals NaN)."""
    return repr([{k: v for k, v in h.items() if k not in WALL_CLOCK} for h in history])


def assert_same_states(a, b):
    assert sorted(a) == sorted(b) and a
    for j in a:
        assert sorted(a[j]) == sorted(b[j])
        for name, v in a[j].items():
            np.testing.assert_array_equal(b[j][name], v)


# --------------------------------------------------------------------------- config
def test_checkpoint_section_is_strict_and_needs_a_store(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'every'"):
        load_config(tiny(checkpoint={"evry": 2}))
    with pytest.raises(ConfigError, match="checkpoint.dir"):
        load_config(tiny(checkpoint={"every": 2}, tracking={"enabled": False}))
    cfg = load_config(tiny(checkpoint={"every": 2, "dir": str(tmp_path)}), ["tracking.enabled=0"])
    assert cfg.checkpoint.every == 2 and load_config(tiny()).checkpoint.every == 0


# --------------------------------------------------------------------------- in process (no Ray)
def _core(cfg, ds):
    runner = ClientRunner(cfg, ds)  # a fresh "worker" for every core
    w0 = initial_weights(cfg, ds)
    return CoordinatorCore(cfg, w0, ds.client_sizes(), InProcessExecutor(runner))


def resume_in_process(raw, stop_after, tmp_path):
    """An uninterrupted core vs one stopped after ``stop_after`` rounds, written to files and
    discarded, then restored into a freshly built core (fresh executor and worker)."""
    cfg = load_config(raw)
    ds = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    ref = _core(cfg, ds)
    while not ref.done:
        ref.step()
    crashed = _core(cfg, ds)
    for _ in range(stop_after):
        crashed.step()
    files = checkpoint.pack({"core": crashed.state_dict()}, cfg, crashed.round)
    checkpoint.write_dir(tmp_path, files)
    del crashed, files
    meta, state = checkpoint.unpack(checkpoint.read_dir(tmp_path))
    assert meta["round"] == stop_after and meta["config_hash"] == checkpoint.config_hash(cfg)
    resumed = _core(cfg, ds)
    resumed.load_state_dict(state["core"])
    while not resumed.done:
        resumed.step()
    assert resumed.digest() == ref.digest()
    assert deterministic(resumed.history) == deterministic(ref.history)
    assert repr(list(resumed.client_table())) == repr(list(ref.client_table()))
    return cfg, ds, ref, state["core"]


def test_async_fedbuff_jobs_in_flight_resume_bit_identically(tmp_path):
    """(b) FedBuff, half-normal delays: jobs dispatched before the checkpoint and due after it are
    re-run on their dispatch version; the partly filled buffer comes back with the strategy."""
    raw = tiny(
        rounds=7,
        algorithm={"name": "fedbuff", "buffer_size": 4},
        delays={"kind": "half_normal", "sigma": 2.0},
        tracking={"enabled": False},
        checkpoint={"every": 3, "dir": str(tmp_path)},
    )
    _, _, _, saved = resume_in_process(raw, 3, tmp_path)
    crossing = [j for j in saved["queue"] if j["dispatch_round"] < 3 <= j["arrival_round"] < 7]
    assert crossing, "no job in flight across the checkpoint: the test would be vacuous"
    assert {j["dispatch_version"] for j in crossing} - {saved["version"]}  # older versions too
    assert {j["dispatch_version"] for j in saved["queue"]} <= set(saved["versions"])
    assert saved["strategy"]["buffer"]  # FedBuff holds updates that have not been applied yet


def test_fedadam_server_state_resumes_bit_identically(tmp_path):
    """(c) FedAdam's moments survive the checkpoint, and they matter: dropping them changes the
    result (so the equality is not vacuous)."""
    raw = tiny(
        rounds=6,
        algorithm={"name": "fedadam", "server_lr": 0.05},
        delays={"kind": "half_normal", "sigma": 1.5},
        tracking={"enabled": False},
        checkpoint={"every": 3, "dir": str(tmp_path)},
    )
    cfg, ds, ref, _ = resume_in_process(raw, 3, tmp_path)
    amnesic = _core(cfg, ds)
    amnesic.load_state_dict(checkpoint.unpack(checkpoint.read_dir(tmp_path))[1]["core"])
    assert np.any(amnesic.strategy.m)
    amnesic.strategy.m = np.zeros_like(amnesic.strategy.m)
    amnesic.strategy.v = np.full_like(amnesic.strategy.v, cfg.algorithm.params.tau**2)
    while not amnesic.done:
        amnesic.step()
    assert amnesic.digest() != ref.digest()


def test_resume_refuses_another_config_naming_the_keys(tmp_path):
    ckpt = {"every": 1, "dir": str(tmp_path)}
    cfg = load_config(tiny(rounds=3, tracking={"enabled": False}, checkpoint=ckpt))
    ds = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    core = _core(cfg, ds)
    core.step()
    checkpoint.write_dir(tmp_path, checkpoint.pack({"core": core.state_dict()}, cfg, 1))
    with pytest.raises(ResumeError) as e:
        prepare_resume(tmp_path, overrides=["local.lr=0.2", "seed=4"])
    assert "local.lr: checkpoint has 0.1, given 0.2" in str(e.value) and "seed" in str(e.value)
    with pytest.raises(ResumeError, match="rounds"):
        prepare_resume(tmp_path, cfg.to_dict() | {"rounds": 9})
    ok = prepare_resume(tmp_path, overrides=["workers.count=1"])  # placement may change
    assert ok.round == 1 and ok.run_id is None and ok.config.workers.count == 1
    (checkpoint_files.current(tmp_path) / "state.json").write_bytes(b"torn")
    with pytest.raises(ResumeError, match="does not match meta.json"):
        checkpoint.load(ok.for_actor(), ok.config)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResumeError, match="holds no checkpoint"):
        prepare_resume(tmp_path / "empty")


def test_a_checkpoint_from_before_a_new_config_key_still_resumes(tmp_path):
    """A key added to raysim after the checkpoint was written (at its default) is not a change
    of config; a real change still is."""
    cfg = load_config(
        tiny(rounds=3, tracking={"enabled": False}, checkpoint={"dir": str(tmp_path)})
    )
    older = cfg.to_dict()
    del older["faults"]["kill_coordinator"]  # the schema before faults.kill_coordinator
    checkpoint.write_dir(tmp_path, checkpoint.pack({"x": np.arange(3.0)}, older, 1))
    src = prepare_resume(tmp_path)
    assert src.round == 1
    np.testing.assert_array_equal(checkpoint.load(src.for_actor(), src.config)["x"], np.arange(3.0))
    with pytest.raises(ResumeError, match="seed"):
        prepare_resume(tmp_path, overrides=["seed=9"])


# --------------------------------------------------------------------------- Ray + MLflow
@pytest.mark.slow
@pytest.mark.matrix  # suite time (~45 s each); the in-process resume tests stay fast
def test_sync_fedavg_crash_then_cli_resume_continues_the_mlflow_run(ray_cluster, mlflow_uri):
    """(a) Sync FedAvg: a session closed after 3 of 5 rounds (the checkpoint is from after round
    1, so round 2 runs twice) resumes from the CLI into the same MLflow run: same weights and
    history as an uninterrupted run, one value per metric per round, FINISHED."""
    from raysim.cli import main

    raw = tiny(
        rounds=5,
        workers={"count": 1},
        checkpoint={"every": 2},
        tracking={"experiment": "checkpoint-tests"},
    )
    ref = raysim.run(raw, ["tracking.enabled=false", "checkpoint.every=0"])  # uninterrupted
    client = MlflowClient(mlflow_uri)
    session = raysim.RunSession(load_config(raw))
    for _ in range(3):
        session.step()
    run_id = session.run_id
    session.close()  # no finish(): the driver went away
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["raysim.checkpoint_round"] == "2"
    folder = run.data.tags["raysim.state.checkpoint"]  # the current one: the only one left
    assert [a.path for a in client.list_artifacts(run_id, "checkpoint")] == [f"checkpoint/{folder}"]
    names = {a.path for a in client.list_artifacts(run_id, f"checkpoint/{folder}")}
    files = ("meta.json", "config.yaml", "arrays.safetensors", "state.json")  # no pickle
    assert names == {f"checkpoint/{folder}/{n}" for n in files}
    with pytest.raises(ResumeError, match=r"local\.epochs: checkpoint has 1, given 2"):
        prepare_resume(run_id, overrides=["local.epochs=2"])
    client.update_run(run_id, status="RUNNING")  # as if killed -9: nobody marked it
    with pytest.raises(ResumeError, match="--force"):
        prepare_resume(run_id)
    assert main(["run", "--resume", run_id, "workers.max_restarts=1", "--force"]) == 0

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["raysim.resumed_at_round"] == "2"
    summary = yaml.safe_load(open(client.download_artifacts(run_id, "summary.yaml")))
    assert summary["weights_digest"] == ref.weights_digest
    keys = {k for h in ref.history for k in h} - WALL_CLOCK
    for key in sorted(keys):
        want = [
            (k, h[key]) for k, h in enumerate(ref.history, 1) if np.isfinite(h.get(key, np.nan))
        ]
        logged = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert logged == want, key  # every round once, none twice, same values
    assert len(client.get_metric_history(run_id, "wall_time")) == 5
    csv_text = open(client.download_artifacts(run_id, "clients.csv")).read()
    # per-client counters cover the whole run
    assert csv_text.splitlines() == artifacts.rows_csv(ref.clients).splitlines()

    with pytest.raises(ResumeError, match="already FINISHED"):
        prepare_resume(run_id)
    with pytest.raises(ResumeError, match="no MLflow run 'not-a-run'"):
        raysim.run(resume="not-a-run")
    exp = client.get_experiment_by_name("checkpoint-tests").experiment_id
    bare = client.create_run(exp).info.run_id
    client.set_terminated(bare, "FAILED")
    with pytest.raises(ResumeError, match="has no checkpoint"):
        raysim.run(resume=bare)


def run_and_keep_checkpoint(cfg, stop_after, snapshot):
    """An uninterrupted run (the reference) that copies its checkpoint aside right after round
    ``stop_after - 1``, as a crash there would leave it; the copy is resumed by a fresh run."""
    session = raysim.RunSession(cfg)
    try:
        for _ in range(stop_after):
            session.step()
        shutil.copytree(cfg.checkpoint.dir, snapshot)
        for _ in session.rounds():
            pass
        return session.finish()
    finally:
        session.close()


SMOKE = EXAMPLES / "fedoa" / "smoke.yaml"
FEDOA_SMALL = [
    "data.text.n_train=24",
    "data.text.n_test=6",
    "model.llama.hidden_size=32",
    "model.llama.intermediate_size=64",
    "model.llama.num_hidden_layers=1",
    "eval.rouge=never",
    "eval.every=2",
    "eval.id=false",
    "tracking.enabled=false",
    "workers.count=1",
    "delays={kind: half_normal, sigma: 1.0}",
    "rounds=3",
    "checkpoint.every=2",
]


@pytest.mark.slow
@pytest.mark.matrix  # suite time (~45 s each); the in-process resume tests stay fast
def test_fedoa_personal_adapters_resume_with_the_run(ray_cluster, tmp_path):
    """(d) FedOA on the tiny LLaMA, half-normal delays: personal adapters (those of clients in
    flight across the checkpoint included) are checkpointed with the run; a fresh run resumed from
    the checkpoint ends with the same weights, history, adapters and per-client table. (The crash
    itself is (a)'s; here the reference keeps running, which saves a third start of the model.)"""
    cfg = load_config(SMOKE, [*FEDOA_SMALL, f"checkpoint.dir={tmp_path / 'live'}"])
    ref = run_and_keep_checkpoint(cfg, 2, tmp_path / "ckpt")
    _, state = checkpoint.unpack(checkpoint.read_dir(tmp_path / "ckpt"))
    core = state["core"]
    assert core["client_states"] and core["evaluator"]["last_clients"]
    in_flight = {j["client"] for j in core["queue"] if j["arrival_round"] < 3}
    assert in_flight & set(core["client_states"]), "no personal state in flight: vacuous"
    res = raysim.run(resume=str(tmp_path / "ckpt"))
    assert res.weights_digest == ref.weights_digest
    assert deterministic(res.history) == deterministic(ref.history)
    assert_same_states(res.client_states, ref.client_states)
    assert repr(res.clients) == repr(ref.clients)
