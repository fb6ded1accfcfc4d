"""Per-client state that is no model parameter (``ClientContext.state``), through the SCAFFOLD
example of ``docs/adding-a-method.md`` §8, saved from the page to a directory outside the repo."""

from __future__ import annotations

import pickle
import re
import shlex

import numpy as np
import pytest
import torch

import raysim
from raysim.actors.local import local_core
from raysim.actors.worker import STATE_PREFIX, split_store, store_entries
from raysim.config import load_config
from tests.conftest import ROOT, fresh_cli, resumed_through_checkpoint, tiny

DOC = ROOT / "docs" / "adding-a-method.md"
KEY = f"{STATE_PREFIX}c_i"


def scaffold_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    return next(b for b in blocks if b.startswith("# scaffold.py"))


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("user") / "scaffold.py"
    path.write_text(scaffold_source())
    return str(path)


def config(plugin: str, **over) -> dict:
    """Full participation (the mean-control property needs it), plain SGD (option II)."""
    base = {
        "rounds": 3,
        "clients": {"num": 6, "per_round": 6},
        "local": {"epochs": 1, "batch_size": 16, "lr": 0.1, "momentum": 0.0},
        "algorithm": {"name": "scaffold", "module": plugin},
        "tracking": {"enabled": False},
    }
    return tiny(**{**base, **over})


def run_local(cfg, rounds=None):
    core = local_core(cfg)
    while not core.done and (rounds is None or core.round < rounds):
        core.step()
    return core


def controls(states) -> np.ndarray:
    return np.stack([np.asarray(states[j][KEY]) for j in sorted(states)])


# --------------------------------------------------------------------------- the store entry
def test_state_entries_round_trip_and_stay_apart_from_the_model_state():
    entries = store_entries({"c": torch.ones(3, dtype=torch.bfloat16), "n": np.int64(4)})
    assert entries[f"{STATE_PREFIX}c"].dtype == np.float32  # numpy has no bf16
    stored = {"2.weight": np.zeros(2, np.float32), **entries}
    model, named = split_store(stored)
    assert list(model) == ["2.weight"] and sorted(named) == ["c", "n"]
    named["c"][0] = 7  # a writable copy: the stored (object-store) value is untouched
    assert stored[f"{STATE_PREFIX}c"][0] == 1
    assert split_store(None) == (None, {})
    with pytest.raises(TypeError, match=r"state\['bad'\] is a list"):
        store_entries({"bad": [1, 2]})


# --------------------------------------------------------------------------- SCAFFOLD in-process
def test_mean_client_control_equals_the_server_control_after_full_participation(plugin):
    core = run_local(load_config(config(plugin)))
    c = core.strategy.control
    assert np.abs(c).max() > 1e-3  # the controls moved: the check below is not 0 == 0
    np.testing.assert_allclose(controls(core.materialized_states()).mean(0), c, atol=1e-6)
    # FedAvg's clients keep no such state at all
    plain = run_local(load_config(tiny(rounds=1, tracking={"enabled": False})))
    assert plain.client_states == {}


def test_one_step_moves_by_minus_lr_times_the_correction(plugin):
    """K = 1 plain SGD step: y = x - lr (g + c - c_i), so against c = c_i (no correction, the
    uncorrected step bit for bit) the delta moves by exactly -lr (c - c_i); the new c_i is
    c_i - c + (x - y) / lr and the upload is its change."""
    from raysim.actors.jobs import ClientJob
    from raysim.actors.worker import ClientRunner
    from raysim.data import build_federated_dataset

    cfg = load_config(
        config(
            plugin,
            local={"epochs": 1, "batch_size": 16, "lr": 0.1, "momentum": 0.0, "max_steps": 1},
        )
    )
    ds = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    runner = ClientRunner(cfg, ds)
    x, _ = runner.initial_global()
    rng = np.random.default_rng(0)
    c = rng.normal(size=x.size).astype(np.float32)
    c_i = rng.normal(size=x.size).astype(np.float32)

    def job(c, c_i):
        return runner.run(x, ClientJob(0, 2, 1, cfg.seed, {KEY: c_i}, {"c": c}))

    plain, same = job(np.zeros_like(c), np.zeros_like(c)), job(c, c)
    np.testing.assert_array_equal(plain.delta, same.delta)
    moved = job(c, c_i)
    np.testing.assert_allclose(moved.delta - plain.delta, -0.1 * (c - c_i), atol=2e-6)
    new = c_i - c - moved.delta / np.float32(0.1)
    np.testing.assert_allclose(moved.state[KEY], new, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(moved.extras["dc"], new - c_i, rtol=1e-5, atol=1e-4)


def test_client_state_reaches_the_server_only_as_its_upload(plugin):
    cfg = load_config(config(plugin))
    core = local_core(cfg)
    seen = []
    arrive = core.strategy.on_arrival
    core.strategy.on_arrival = lambda u: seen.append(u) or arrive(u)
    while not core.done:
        core.step()
    states = core.materialized_states()
    assert all(sorted(u.extras) == ["dc"] for u in seen) and len(seen) == 18
    server_state = {k: v for k, v in core.strategy.state_dict().items() if k != "on_arrival"}
    to_server = pickle.dumps((seen, server_state))
    for j, st in states.items():
        blob = np.asarray(st[KEY]).tobytes()
        assert blob[:64] not in to_server, f"client {j}'s c_i reached the server"


def test_client_state_resumes_bit_identically(plugin):
    cfg = load_config(config(plugin, rounds=4))
    full = run_local(cfg)
    resumed, saved = resumed_through_checkpoint(cfg, 2)
    assert KEY in saved["client_states"][0]
    assert resumed.digest() == full.digest()
    a, b = resumed.materialized_states(), full.materialized_states()
    np.testing.assert_array_equal(controls(a), controls(b))
    np.testing.assert_array_equal(resumed.strategy.control, full.strategy.control)


# --------------------------------------------------------------------------- on Ray workers
# matrix tier (suite time): per-client actors; the pooled Ray path stays in the fast suite
@pytest.mark.matrix
def test_an_actor_per_client_agrees_with_the_pooled_run(plugin, ray_cluster):
    """Against the in-process run, on Ray with an actor per client: digest and every c_i (the
    page's test below covers one worker, two with one killed, and a resumed coordinator)."""
    cfg = config(plugin, clients={"num": 4, "per_round": 4})
    reference = run_local(load_config(cfg))
    res = raysim.run(cfg, ["workers.count=per_client", "workers.num_cpus=0.1"])
    assert res.weights_digest == reference.digest()
    np.testing.assert_array_equal(
        controls(res.client_states), controls(reference.materialized_states())
    )


@pytest.mark.slow
@pytest.mark.matrix  # suite time: a long end-to-end run
def test_the_page_example_runs_from_outside_the_repo_on_2_workers_through_a_kill_and_a_resume(
    plugin, tmp_path
):
    """The page's file and command, in a fresh process whose working directory is not the repo,
    on two workers, one killed in round 1 and the coordinator killed before round 2 (its
    successor resumes from the checkpoint of round 2): the uninterrupted in-process digest."""
    (tmp_path / "scaffold.py").write_text(scaffold_source())
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    command = next(line for b in blocks for line in b.splitlines() if "scaffold" in line)

    argv = [str(ROOT / a) if a.startswith("examples/") else a for a in shlex.split(command)]
    faults = ["checkpoint.every=1", f"checkpoint.dir={tmp_path / 'ckpt'}"]
    faults += ["faults.kill_worker.round=1", "faults.kill_worker.worker=1"]
    faults += ["faults.kill_coordinator.round=2"]
    common = ["rounds=3", "clients.per_round=5", "tracking.enabled=false"]
    out = fresh_cli([*argv[1:], *common, "workers.count=2", *faults], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "worker 1 restarted" in said and "took over from the checkpoint of round 2" in said
    digest = re.search(r"weights sha256: (\w+)", out.stdout).group(1)
    local = [a.replace("./scaffold.py", plugin) for a in argv[3:]]  # the same file, imported once
    assert run_local(load_config(argv[2], [*local, *common])).digest() == digest
