"""Remake this folder with the previous release's code (README.md says which and how).

Runs the same small config twice without Ray: once to the end (the digests of its final weights
and personal states go in ``tests/test_previous_release.py``), and once stopped after its
checkpoint of round 3, whose files and the personal-state files it refers to are copied here.
Then the previous release resumes that checkpoint itself, to check that it ends on the same
digests.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np

import raysim

#: where the runs write: the checkpoint names its personal-state store by this absolute path
WORK = Path("/tmp/raysim-previous-release")
HERE = Path(__file__).resolve().parent


def config() -> dict:
    return {
        "name": "previous-release",
        "seed": 5,
        "rounds": 6,
        "clients": {
            "num": 8,
            "per_round": 3,
            "state": {"store": "disk", "dir": str(WORK / "states")},
        },
        "data": {"name": "digits", "partition": {"kind": "dirichlet", "alpha": 0.5}},
        "model": {"name": "mlp", "hidden": [8]},
        "local": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "algorithm": {"name": "ditto"},
        "delays": {"kind": "half_normal", "sigma": 1.5},
        "eval": {"every": 1},
        "workers": {"count": 1},
        "runtime": "local",
        "tracking": {"enabled": False},
        "checkpoint": {"every": 3, "dir": str(WORK / "checkpoint")},
    }


class _Stop(Exception):
    pass


def _stop_after_round_3(metrics: dict) -> None:
    if metrics["round"] >= 3:
        raise _Stop


def personal_digest(states: dict) -> str:
    """sha256 of every client's personal arrays as float32, by client then array name."""
    flat = [np.ravel(states[c][k]) for c in sorted(states) for k in sorted(states[c])]
    return hashlib.sha256(np.concatenate(flat).astype("<f4").tobytes()).hexdigest()


def _stored(node: object) -> list[dict]:
    """The ``StoredState`` entries of a state.json tree."""
    if isinstance(node, list):
        return [s for v in node for s in _stored(v)]
    if not isinstance(node, dict):
        return []
    if str(node.get("__type__", "")).endswith(".StoredState"):
        return [node["fields"]]
    return [s for v in node.values() for s in _stored(v)]


def main() -> None:
    print("raysim from", raysim.__file__)
    shutil.rmtree(WORK, ignore_errors=True)
    full = raysim.run(config())
    digest = full.weights_digest, personal_digest(full.client_states)
    print("uninterrupted run's digests (weights, personal states):", *digest)
    shutil.rmtree(WORK)
    try:
        raysim.run(config(), on_round=_stop_after_round_3)
    except _Stop:
        pass
    for old in ("checkpoint", "states"):
        shutil.rmtree(HERE / old, ignore_errors=True)
    root = WORK / "checkpoint"
    latest = (root / "LATEST").read_text().strip()
    (HERE / "checkpoint").mkdir()
    shutil.copy(root / "LATEST", HERE / "checkpoint" / "LATEST")
    shutil.copytree(root / latest, HERE / "checkpoint" / latest)
    state = json.loads((root / latest / "state.json").read_text())
    (store,) = {s["root"] for s in _stored(state)}
    mine = HERE / "states" / Path(store).relative_to(WORK / "states")
    mine.mkdir(parents=True)
    shutil.copy(Path(store) / "STORE.json", mine / "STORE.json")
    for s in _stored(state):
        name = f"{s['client'] // 1000:04d}/{s['client']}-{s['job']}.safetensors"
        (mine / name).parent.mkdir(exist_ok=True)
        shutil.copy(Path(store) / name, mine / name)
    resumed = raysim.run(resume=str(root))
    again = resumed.weights_digest, personal_digest(resumed.client_states)
    print("resumed by the same release:", *again)
    if again != digest:
        sys.exit("the previous release does not resume its own checkpoint to its digest")
    shutil.rmtree(WORK)


if __name__ == "__main__":
    main()
