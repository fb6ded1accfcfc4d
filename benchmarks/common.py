"""Shared helpers for the benchmark scripts: a machine description and ``key=value`` reporting."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
if str(ROOT) not in sys.path:  # `python benchmarks/x.py` puts benchmarks/, not the root, first
    sys.path.insert(0, str(ROOT))

from raysim.util.machine import cpu_model  # noqa: E402


def machine() -> str:
    """One line: CPU model, core count, torch/ray/python versions (Ray "absent" where a script
    that needs no Ray runs without it, as on the GPU machine)."""
    import torch

    try:
        import ray

        ray_version = ray.__version__
    except ImportError:
        ray_version = "absent"
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"ray {ray_version}, python {platform.python_version()}"
    )


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def report(name: str | None = None, **fields: object) -> None:
    """Print one ``key=value`` line per field, keys prefixed by ``name.`` when given."""
    prefix = f"{name}." if name else ""
    for key, value in fields.items():
        print(f"{prefix}{key}={_fmt(value)}", flush=True)


def steady(values: Sequence[float], warmup: int = 3) -> float:
    """Median of ``values`` after the first ``warmup`` (all of them if there are too few)."""
    tail = list(values[warmup:]) or list(values)
    return statistics.median(tail)


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (``ru_maxrss`` is KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class TreeMemory(threading.Thread):
    """Polls a process and every process under it (Ray's and raysim's) every ``every_s``: the
    peak resident memory per role (``driver``: the process itself, ``coordinator``, ``worker``:
    the largest), and with ``pss`` the peak of their summed proportional set size (shared
    memory counted once; slower to read)."""

    def __init__(self, pid: int, every_s: float = 0.05, pss: bool = False) -> None:
        super().__init__(daemon=True)
        self.pid, self.every_s, self.pss = pid, every_s, pss
        self.peak: dict[str, int] = {"driver": 0, "coordinator": 0, "worker": 0, "pss": 0}
        self.done = threading.Event()

    @staticmethod
    def role(cmdline: str) -> str | None:
        if "ray::Coordinator" in cmdline:
            return "coordinator"
        return "worker" if "ray::Worker" in cmdline else None

    def run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self.done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                return
            pss = 0
            for p in procs:
                try:
                    role = "driver" if p.pid == self.pid else self.role(" ".join(p.cmdline()))
                    if role is not None:
                        self.peak[role] = max(self.peak[role], p.memory_info().rss)
                    if self.pss:
                        pss += p.memory_full_info().pss
                except psutil.Error:
                    continue
            self.peak["pss"] = max(self.peak["pss"], pss)
            time.sleep(self.every_s)


@dataclass
class Watched:
    """A finished ``raysim run``: its memory (``TreeMemory``), seconds and MLflow run."""

    memory: TreeMemory
    seconds: float
    run: Any
    client: Any

    def metric(self, key: str) -> list[float]:
        """The run's values of ``key`` in step order."""
        history = self.client.get_metric_history(self.run.info.run_id, key)
        return [m.value for m in sorted(history, key=lambda m: m.step)]


def raysim_run(
    args: Sequence[str], folder: Path, every_s: float = 0.05, pss: bool = False
) -> Watched:
    """``raysim run ARGS`` in ``folder`` on a fresh sqlite store there, its memory watched.
    Exits with the command's stderr if it fails."""
    import subprocess

    uri = f"sqlite:///{folder / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("RAY_ADDRESS", None)
    argv = [sys.executable, "-m", "raysim.cli", "run", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watch = TreeMemory(proc.pid, every_s, pss)
    watch.start()
    _, err = proc.communicate()
    watch.done.set()
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"raysim run {' '.join(args)}: exit {proc.returncode}: {err[-600:]}")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("raysim").experiment_id])
    return Watched(watch, took, run, client)
