"""A checkpoint written by the previous release (a3a3211, before the modules moved into packages)
resumes with this code to the weights (and clients' personal states) of that release's
uninterrupted run.

The checkpoint (``tests/data/previous_release_checkpoint``, made by its ``make.py``) is of a Ditto
run with personal state on disk and jobs in flight across it: its ``state.json`` names the
clients' stored states as ``raysim.state_store.StoredState``, a module path that is now
``raysim.state.store``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import raysim
from raysim import _moved
from raysim.state import checkpoint, checkpoint_files
from raysim.state.store import StoredState

FIXTURE = Path(__file__).parent / "data" / "previous_release_checkpoint"
#: where make.py's runs wrote: the checkpoint names its personal-state store by this path
MADE_IN = "/tmp/raysim-previous-release"
#: the fixture's config run to the end, uninterrupted, by a3a3211: its final weights' digest and
#: its clients' personal states' (``personal_digest``), as ``make.py`` printed them (that
#: release resumed its own checkpoint to both too)
DIGEST = "f7378c5eedb71774cbee15f424299fe618931de395e70acd909a5c1234b4176e"
PERSONAL_DIGEST = "67f96714408ad2c68e51086f44ced1390cfae7fdb7cded53282210df4be46e2a"


def personal_digest(states: dict) -> str:
    """sha256 of every client's personal arrays as float32, by client then array name (as
    ``make.py`` computes it)."""
    flat = [np.ravel(states[c][k]) for c in sorted(states) for k in sorted(states[c])]
    return hashlib.sha256(np.concatenate(flat).astype("<f4").tobytes()).hexdigest()


def relocated(tmp_path: Path) -> Path:
    """The fixture copied into ``tmp_path``, its store's absolute path in ``state.json`` made
    the copy's (and ``meta.json``'s digest of that file with it); the checkpoint's folder."""
    shutil.copytree(FIXTURE / "checkpoint", tmp_path / "checkpoint")
    shutil.copytree(FIXTURE / "states", tmp_path / "states")
    folder = checkpoint_files.current(tmp_path / "checkpoint")
    assert folder is not None
    state = (folder / checkpoint.STATE).read_text()
    assert f'"{MADE_IN}/states/' in state
    state = state.replace(f'"{MADE_IN}/states/', f'"{tmp_path / "states"}/')
    (folder / checkpoint.STATE).write_text(state)
    meta = json.loads((folder / checkpoint.META).read_text())
    meta["files"][checkpoint.STATE] = hashlib.sha256(state.encode()).hexdigest()
    (folder / checkpoint.META).write_text(json.dumps(meta, indent=1))
    return tmp_path / "checkpoint"


@pytest.fixture
def without_old_names(monkeypatch):
    """No alias for the modules that moved (``raysim._moved``, gone after the next release)."""
    finders = [f for f in sys.meta_path if not isinstance(f, _moved._MovedFinder)]
    monkeypatch.setattr(sys, "meta_path", finders)
    for old in _moved.MOVED:
        monkeypatch.delitem(sys.modules, old, raising=False)


def test_the_old_checkpoints_module_paths_decode_without_the_aliases(without_old_names):
    folder = checkpoint_files.current(FIXTURE / "checkpoint")
    text = (folder / checkpoint.STATE).read_text()
    assert '"raysim.state_store.StoredState"' in text  # the module path of the release before
    files = checkpoint.read_dir(FIXTURE / "checkpoint")
    meta, state = checkpoint.unpack(files)
    stored = state["core"]["client_states"]
    assert meta["round"] == 3 and len(stored) == 6
    assert all(type(s) is StoredState for s in stored.values())
    assert {s.client for s in stored.values()} == set(stored)
    assert "raysim.state_store" not in sys.modules  # read by the codec's table, no alias


def test_a_previous_release_checkpoint_resumes_to_its_uninterrupted_digest(
    tmp_path, without_old_names
):
    """Where this code on this machine runs the config to the previous release's digest, the
    resumed run ends on it too. Elsewhere (another kind of CPU rounds differently: bit for bit
    is promised on one machine only, docs/execution.md) it ends where the uninterrupted run
    does, to float rounding."""
    source = relocated(tmp_path)
    resumed = raysim.run(resume=source, overrides=[f"checkpoint.dir={source}"])
    assert not Path(MADE_IN).exists()  # nothing written where the old run was
    stored = yaml.safe_load((checkpoint_files.current(source) / checkpoint.CONFIG).read_text())
    here = raysim.run(stored, [f"clients.state.dir={tmp_path / 'again'}", "checkpoint.every=0"])
    if here.weights_digest == DIGEST:
        assert resumed.weights_digest == DIGEST
        assert personal_digest(resumed.client_states) == PERSONAL_DIGEST
        return
    np.testing.assert_allclose(resumed.weights, here.weights, rtol=1e-4, atol=1e-5)
    assert sorted(resumed.client_states) == sorted(here.client_states)
    for client, arrays in here.client_states.items():
        for name, value in arrays.items():
            got = resumed.client_states[client][name]
            np.testing.assert_allclose(got, value, rtol=1e-4, atol=1e-5, err_msg=name)
