"""Personal state on disk (issue 43, ``clients.state.store: disk``): the same run as in memory,
no version left that nothing reads, a resume from a checkpoint that refers to the files, and a
store that is gone said in one line."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.actors.local import local_core
from raysim.config import load_config
from raysim.state import checkpoint
from raysim.state.store import DiskStateStore, StateStoreError, StoredState, load_entry
from tests.conftest import tiny


def ditto(tmp_path, store: str = "disk", **over):
    """Ditto keeps a personal model per client: personal state on every visit."""
    raw = tiny(
        rounds=6,
        clients={
            "num": 12,
            "per_round": 4,
            "state": {"store": store, "dir": str(tmp_path / "states")},
        },
        **{"algorithm": {"name": "ditto"}, "tracking": {"enabled": False}, **over},
    )
    return load_config(raw)


def run_to_end(core):
    while not core.done:
        core.step()
    return core


def arrays(state) -> dict[str, np.ndarray]:
    return dict(load_entry(state))


def test_a_version_is_written_whole_or_not_at_all_and_read_back(tmp_path):
    store = DiskStateStore(tmp_path)
    entry = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(7)}
    token = store.save(3, 41, entry)
    assert token == StoredState(str(tmp_path), 3, 41, token.nbytes) and token.nbytes > 48
    (tmp_path / "0000" / ".3-42.safetensors.999.tmp").write_bytes(b"half a write")  # a crash
    back = DiskStateStore(tmp_path).load(token)  # a fresh process: from the file
    assert all(np.array_equal(back[k], v) and back[k].shape == v.shape for k, v in entry.items())
    assert not back["w"].flags.writeable
    assert store.files() == 1  # the cut-short write is not a version
    store.delete(token)
    with pytest.raises(StateStoreError, match="client 3's personal state cannot be read"):
        DiskStateStore(tmp_path).load(token)


def test_a_deleted_store_is_said_in_one_line(tmp_path):
    store = DiskStateStore(tmp_path / "s")
    token = store.save(1, 1, {"a": np.ones(3, np.float32)})
    import shutil

    shutil.rmtree(tmp_path / "s")
    with pytest.raises(StateStoreError) as e:
        DiskStateStore(tmp_path / "s").load(token)
    assert "the store is gone" in str(e.value) and "\n" not in str(e.value)


def test_the_cache_holds_at_most_its_bytes(tmp_path):
    store = DiskStateStore(tmp_path, cache_bytes=3000)
    tokens = [store.save(j, 0, {"a": np.full(250, j, np.float32)}) for j in range(5)]
    for t in tokens:
        store.load(t)
    assert store._cached <= 3000 and len(store._cache) < 5


def test_disk_gives_the_run_of_memory_and_keeps_one_version_per_client(tmp_path):
    mem = run_to_end(local_core(ditto(tmp_path, "memory"), evaluate=True))
    disk = run_to_end(local_core(ditto(tmp_path, "disk"), evaluate=True))
    assert disk.digest() == mem.digest()
    assert [h.get("accuracy") for h in disk.history] == [h.get("accuracy") for h in mem.history]
    assert set(disk.client_states) == set(mem.client_states) and disk.client_states
    for j, token in disk.client_states.items():
        assert isinstance(token, StoredState)
        mine, theirs = arrays(token), mem.client_states[j]
        assert mine.keys() == theirs.keys()
        assert all(np.array_equal(mine[k], theirs[k]) for k in mine)
    store = DiskStateStore(disk.state_root)
    assert store.files() == len(disk.client_states)  # older versions were deleted
    assert not disk._readers and not disk._job_states


def test_a_resume_reads_the_versions_its_checkpoint_names(tmp_path):
    """The checkpoint refers to files; rounds after it write new versions and delete old ones,
    but not the checkpoint's: a resumed core ends on the uninterrupted digest."""
    cfg = ditto(tmp_path)
    ref = run_to_end(local_core(cfg, evaluate=True))
    crashed = local_core(cfg, evaluate=True)
    for _ in range(3):
        crashed.step()
    files = checkpoint.pack({"core": crashed.state_dict()}, cfg, crashed.round)
    crashed.checkpoint_written()
    saved = {j: t for j, t in crashed.client_states.items()}
    run_to_end(crashed)  # the run went on, and then died
    for token in saved.values():
        assert arrays(token)  # still readable
    _, state = checkpoint.unpack(files)
    resumed = local_core(cfg, evaluate=True)
    resumed.load_state_dict(state["core"])
    assert resumed.state_root == crashed.state_root
    run_to_end(resumed)
    assert resumed.digest() == ref.digest()


@pytest.mark.parametrize(
    ("store", "tracking", "kept", "said"),
    [
        ("disk", {}, "arrays", None),
        ("disk", {"client_states_max_mb": 0}, "tokens", "a manifest of its store"),
        ("memory", {}, "arrays", None),
        ("memory", {"client_states_max_mb": 0}, "nothing", "is not logged"),
        ("memory", {"client_states": "arrays", "client_states_max_mb": 0}, "arrays", None),
        ("disk", {"client_states": "none"}, "nothing", None),
    ],
)
def test_the_runs_end_records_what_tracking_client_states_asks(
    tmp_path, store, tracking, kept, said
):
    core = run_to_end(local_core(ditto(tmp_path, store, tracking=tracking)))
    states, note = core.final_states()
    if kept == "nothing":
        assert states == {}
    else:
        assert set(states) == set(core.client_states)
        want = StoredState if kept == "tokens" else dict
        assert all(isinstance(v, want) for v in states.values())
    assert (note is None) if said is None else (said in note and "\n" not in note)


def test_a_manifest_needs_a_store_on_disk():
    from raysim.config import ConfigError

    with pytest.raises(ConfigError, match="set clients.state.store=disk"):
        load_config(tiny(tracking={"client_states": "manifest"}))


@pytest.mark.matrix  # suite time (~17 s on 2 vCPUs): the fast suite's budget
@pytest.mark.slow
def test_a_ray_run_with_two_workers_keeps_state_on_disk_and_says_where(
    ray_cluster, mlflow_uri, tmp_path
):
    """Two workers write and read each other's clients' versions; the run ends on the
    in-process digest, and its artifact is a manifest of the store, not the arrays."""
    import json

    from mlflow.tracking import MlflowClient

    import raysim

    cfg = ditto(tmp_path, tracking={"enabled": True, "client_states": "manifest"})
    res = raysim.run(cfg, ["workers.count=2", "workers.num_cpus=0.5"])
    local = run_to_end(local_core(ditto(tmp_path, "memory"), evaluate=True))
    assert res.weights_digest == local.digest()
    tokens = res.client_states
    assert tokens and all(isinstance(t, StoredState) for t in tokens.values())
    root = next(iter(tokens.values())).root
    assert DiskStateStore(root).files() == len(tokens)
    for j, token in tokens.items():
        assert all(np.array_equal(arrays(token)[k], v) for k, v in local.client_states[j].items())
    client = MlflowClient(mlflow_uri)
    names = {a.path for a in client.list_artifacts(res.run_id)}
    assert "client_states.json" in names and "client_states.safetensors" not in names
    manifest = json.load(open(client.download_artifacts(res.run_id, "client_states.json")))
    assert manifest["store"] == root and len(manifest["clients"]) == len(tokens)
    assert client.get_run(res.run_id).data.tags["raysim.state.store"] == root


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault",
    [
        # matrix tier: a re-run job reads and writes the store as any job does
        pytest.param(
            ["faults.kill_worker.round=2", "faults.kill_worker.worker=1"], marks=pytest.mark.matrix
        ),
        # matrix tier too: the in-process resume test holds the checkpoint's files the same way
        pytest.param(
            ["checkpoint.every=2", "faults.kill_coordinator.round=3"], marks=pytest.mark.matrix
        ),
    ],
    ids=["worker killed", "coordinator killed"],
)
def test_a_killed_process_loses_no_clients_state(ray_cluster, mlflow_uri, tmp_path, fault):
    """A worker killed mid-run is replaced and its jobs run again; a coordinator killed after
    a checkpoint is replaced from it, in the same store folder: the run ends on the digest
    of one that nothing struck, every client's last version readable, nothing left over."""
    import raysim

    cfg = ditto(tmp_path, tracking={"enabled": True, "client_states": "manifest"})
    res = raysim.run(cfg, ["workers.count=2", "workers.num_cpus=0.5", *fault])
    local = run_to_end(local_core(ditto(tmp_path, "memory"), evaluate=True))
    assert res.weights_digest == local.digest()
    root = next(iter(res.client_states.values())).root
    for j, token in res.client_states.items():
        assert all(np.array_equal(arrays(token)[k], v) for k, v in local.client_states[j].items())
    assert DiskStateStore(root).files() >= len(res.client_states)


def test_a_checkpoint_whose_store_was_deleted_is_refused_before_any_round(tmp_path):
    import shutil

    cfg = ditto(tmp_path)
    core = local_core(cfg)
    for _ in range(3):
        core.step()
    files = checkpoint.pack({"core": core.state_dict()}, cfg, core.round)
    shutil.rmtree(tmp_path / "states")
    _, state = checkpoint.unpack(files)
    with pytest.raises(StateStoreError, match=r"personal-state store .* is gone") as e:
        local_core(cfg).load_state_dict(state["core"])
    assert "\n" not in str(e.value)


@pytest.mark.matrix  # the CLI's line for the refusal above, through Ray and MLflow
def test_resuming_a_run_whose_store_was_deleted_says_so_in_one_line(
    ray_cluster, mlflow_uri, tmp_path, capsys
):
    import shutil

    import raysim
    from raysim import cli

    cfg = ditto(tmp_path, tracking={"enabled": True}, checkpoint={"every": 2})
    session = raysim.RunSession(cfg)
    for _ in range(3):
        session.step()
    session.close()  # stopped after round 3, its checkpoint after round 2
    shutil.rmtree(tmp_path / "states")
    capsys.readouterr()
    assert cli.main(["run", "--resume", session.run_id]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "personal-state store" in err[0] and "is gone" in err[0]


# --------------------------------------------------------------------------- eval.clients
def _evaluator(group: str, clients: int | None, num: int = 1000, adapt: bool = False):
    from raysim.actors.evaluation import WorkerEvaluator
    from raysim.config import EvalConfig

    return WorkerEvaluator(
        None,
        {"test": None},
        group,
        EvalConfig(clients=clients),
        global_group="global",
        adapt=adapt,
        num_clients=num,
        seed=7,
    )


def test_eval_clients_scores_the_first_clients_with_personal_state_every_round():
    ev = _evaluator("personal", 2)
    states = {5: {}, 2: {}, 9: {}, 1: {}}  # in the order the clients first had one
    assert [j.client for j in ev.jobs(states, False) if j.client is not None] == [2, 5]
    everyone = _evaluator("personal", None)
    assert [j.client for j in everyone.jobs(states, False) if j.client is not None] == [1, 2, 5, 9]


def test_eval_clients_draws_one_sample_of_the_population_for_adapted_views():
    ev = _evaluator("global", 10, adapt=True)
    first = [j.client for j in ev.jobs({}, False) if j.client is not None]
    assert len(first) == 10 and first == sorted(first)
    assert first == [j.client for j in ev.jobs({}, True, round=5) if j.client is not None]
    assert len([j for j in _evaluator("global", None, adapt=True).jobs({}, False)]) == 1001
    other = _evaluator("global", 10, adapt=True)
    other_seed = type(other)(
        None, {"test": None}, "global", other.cfg, adapt=True, num_clients=1000, seed=8
    )
    assert other_seed.sample != ev.sample


def test_eval_clients_bounds_a_personal_runs_evaluation(tmp_path):
    core = run_to_end(local_core(ditto(tmp_path, eval={"every": 1, "clients": 3}), evaluate=True))
    assert [h["clients_evaluated"] for h in core.history][-1] == 3
    full = run_to_end(local_core(ditto(tmp_path), evaluate=True))
    assert full.history[-1]["clients_evaluated"] == len(full.client_states) > 3


def test_the_driver_gets_the_client_rows_up_to_a_bound_and_clients_csv_all(tmp_path, caplog):
    """Issue 43: ``Result.clients`` carries every row up to a bound, above it none, said in
    one line; the rows for ``clients.csv`` join each client's counters with its last scores."""
    core = run_to_end(local_core(ditto(tmp_path, eval={"every": 1, "clients": 3}), evaluate=True))
    rows = list(core.client_rows())
    assert [r["client"] for r in rows] == sorted(core.stats) and len(rows) > 3
    assert sum("accuracy" in r for r in rows) == 3  # eval.clients: 3
    columns = core.client_columns()
    assert columns[:3] == ["client", "num_samples", "dispatched"] and "accuracy" in columns
    assert core.result_rows() == rows
    with caplog.at_level("WARNING", logger="raysim"):
        assert core.result_rows(limit=len(rows) - 1) == []
    assert f"{len(rows)} clients took part: Result.clients is left empty" in caplog.text


def test_a_store_this_process_does_not_see_is_refused_in_one_line(tmp_path):
    """What a worker on a node without the run's store meets (the loopback cluster test in
    ``tests/test_cluster.py`` shows it across nodes): no mark of the coordinator's store there,
    one line naming the setting; once the coordinator made the store, it opens."""
    from pathlib import Path

    from raysim.state.store import open_store, run_folder, store_at

    root = run_folder(str(tmp_path / "states"))
    with pytest.raises(StateStoreError, match=r"is not on this node .*clients\.state\.dir must"):
        store_at(root)
    assert not Path(root).exists()  # nothing made where the store should have been
    assert open_store(root) is store_at(root) and (Path(root) / "STORE.json").is_file()
