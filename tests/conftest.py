"""Shared fixtures: one Ray instance per test session (ray.init costs 5–9 s on 2 vCPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    uri = f"sqlite:///{path}"
    os.environ["MLFLOW_TRACKING_URI"] = uri  # before ray.init, so every process agrees
    return uri


@pytest.fixture(scope="session")
def ray_cluster(mlflow_uri):
    """A local Ray instance with 2 CPUs and 4 *logical* GPUs (fractional placement on CPU)."""
    import ray

    from raysim.launch.private_ray import ensure_ray

    ensure_ray(num_cpus=2, num_gpus=4, logging_level="ERROR")  # token auth, loopback only
    yield ray
    ray.shutdown()


def tiny(**overrides) -> dict:
    """A few-second digits run; keyword overrides replace top-level sections."""
    cfg = {
        "name": "tiny",
        "seed": 3,
        "rounds": 4,
        "clients": {"num": 20, "per_round": 5},
        "data": {"name": "digits", "partition": {"kind": "dirichlet", "alpha": 0.3}},
        "model": {"name": "mlp", "hidden": [32]},
        "local": {"epochs": 1, "batch_size": 16, "lr": 0.1},
        "algorithm": {"name": "fedavg"},
        "eval": {"every": 1},
        "workers": {"count": 2},
    }
    cfg.update(overrides)
    return cfg


def sweep_cfg(experiment: str, tune: dict, rounds: int = 2, **tracking) -> dict:
    """A sweep of ``tiny`` runs with one worker each (10 clients, 4 a round), logged to MLflow
    experiment ``experiment`` (``tracking``: more of the tracking section)."""
    return tiny(
        rounds=rounds,
        clients={"num": 10, "per_round": 4},
        workers={"count": 1, "num_cpus": 0.5},
        tracking={**tracking, "experiment": experiment},
        tune=tune,
    )


def fresh_cli(
    args: list[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``raysim ARGS`` in a fresh process started in ``cwd`` (its own private Ray); ``env``:
    variables to set besides this process's."""
    env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "raysim.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def resumed_through_checkpoint(cfg, stop_after: int):
    """Run ``cfg`` in-process for ``stop_after`` rounds, pack the core into checkpoint files,
    unpack them into a freshly built core and run that to the end: (the resumed core, the
    unpacked core state)."""
    from raysim.actors.local import local_core
    from raysim.state import checkpoint

    half = local_core(cfg)
    for _ in range(stop_after):
        half.step()
    _, loaded = checkpoint.unpack(checkpoint.pack({"core": half.state_dict()}, cfg, half.round))
    resumed = local_core(cfg)
    resumed.load_state_dict(loaded["core"])
    while not resumed.done:
        resumed.step()
    return resumed, loaded["core"]
