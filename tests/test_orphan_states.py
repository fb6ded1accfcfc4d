"""No orphan files in the personal-state store (``clients.state.store: disk``): a worker saves a
client's new version before the coordinator accepts its update; when the coordinator rejects
the update (non-finite, ``faults.corrupt_updates``) or stops on it (``Diverged``), the version
it saved is never the client's and must be deleted, not left in the store."""

from __future__ import annotations

import pytest

from raysim.actors.local import local_core
from raysim.algorithms.base import Diverged
from raysim.config import load_config
from raysim.state.store import DiskStateStore
from tests.conftest import tiny


def ditto(tmp_path, faults: list[dict]):
    """Ditto (a personal model per client, saved on every visit), every client every round."""
    raw = tiny(
        rounds=3,
        clients={
            "num": 6,
            "per_round": 6,
            "state": {"store": "disk", "dir": str(tmp_path / "states")},
        },
        algorithm={"name": "ditto"},
        tracking={"enabled": False},
        eval={"every": 1},
        faults={"corrupt_updates": faults},
    )
    return load_config(raw)


def run_to_end(core):
    while not core.done:
        core.step()
    return core


def test_a_rejected_update_leaves_no_version_in_the_store(tmp_path):
    faults = [{"client": 2, "round": 1}, {"client": 4, "round": 2, "value": "inf"}]
    core = run_to_end(local_core(ditto(tmp_path, faults), evaluate=True))
    assert core.final_metrics()["rejected_updates"] == 2
    assert core.stats[2].rejected == 1 and core.stats[4].rejected == 1
    store = DiskStateStore(core.state_root)
    # every file is a client's current version: none of the rejected updates' is left
    assert store.files() == len(core.stored_states()) == len(core.client_states) == 6
    names = {p.relative_to(store.root).as_posix() for p in store.root.glob("*/*.safetensors")}
    assert names == {s.name for s in core.stored_states()}
    assert not core._readers and not core._job_states


def test_rejections_do_not_change_the_run(tmp_path):
    """Deleting the rejected versions changes no result: the same digest twice."""
    faults = [{"client": 1, "round": 0}, {"client": 3, "round": 1}]
    a = run_to_end(local_core(ditto(tmp_path / "a", faults), evaluate=True))
    b = run_to_end(local_core(ditto(tmp_path / "b", faults), evaluate=True))
    assert a.digest() == b.digest()
    assert [h.get("accuracy") for h in a.history] == [h.get("accuracy") for h in b.history]


def test_a_run_that_stops_on_a_non_finite_update_leaves_no_version_of_it(tmp_path, monkeypatch):
    core = local_core(ditto(tmp_path, [{"client": 2, "round": 1}]))
    monkeypatch.setattr(type(core.strategy), "stop_on_nonfinite", True)
    with pytest.raises(Diverged, match="client 2's update is not finite"):
        run_to_end(core)
    store = DiskStateStore(core.state_root)
    names = {p.relative_to(store.root).as_posix() for p in store.root.glob("*/*.safetensors")}
    # client 2's: only its current version (round 0's), not the one of its diverged update
    # (versions of jobs computed but not delivered when the run stopped may remain: in flight)
    assert {n for n in names if n.startswith("0000/2-")} == {core.client_states[2].name}
    assert core.client_states[2].job <= 6  # a round-0 job (6 clients a round)
