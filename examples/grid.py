"""What the examples' reproduce.py scripts share: one run of a config in this process, and a
grid of them that keeps every finished run in a results.json (so an interrupted grid goes on
where it stopped)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any


def machine() -> str:
    """Where a run ran, kept with its results: CPU model, cores, Python (a CPU's kernels round
    floats their own way, so a report compares runs of one machine)."""
    import os
    import platform

    from raysim.util.machine import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run_one(config: Path, overrides: list[str], keep: Sequence[str]) -> dict[str, Any]:
    """One run of ``config`` with ``overrides``, without Ray: each round's ``keep`` metrics, the
    final weights' digest, the seconds it took and the machine it ran on (a CPU's kernels round
    floats their own way: a report compares runs of one machine)."""
    from raysim.actors.local import local_core
    from raysim.config import load_config

    core = local_core(load_config(config, overrides), evaluate=True)
    t0 = time.perf_counter()
    while not core.done:
        core.step()
    core.settle()
    rounds = [{k: h[k] for k in keep if k in h} for h in core.history]
    return {
        "rounds": rounds,
        "digest": core.digest(),
        "seconds": time.perf_counter() - t0,
        "machine": machine(),
    }


def metric_histories(uri: str, run_id: str, keys: Iterable[str]) -> dict[str, list[list[float]]]:
    """A run's metrics ``keys`` as ``[round, value]`` pairs (rounds numbered from 1), from the
    MLflow store at ``uri``: kept in a results.json, so that a report needs no store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    out = {}
    for key in keys:
        points = client.get_metric_history(run_id, key)
        if points:
            out[key] = [[m.step, m.value] for m in sorted(points, key=lambda m: m.step)]
    return out


def run_grid(
    path: Path,
    cells: Iterable[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]],
    line: Callable[[dict[str, Any]], str],
    start: Path | None = None,
) -> dict[str, Any]:
    """Each (key, run) of ``cells`` whose key ``path`` (or, if it does not exist yet,
    ``start``) lacks: ``run(the runs so far)``, written to ``path`` at once; ``line`` says what a
    run ended on."""
    source = path if path.is_file() else start
    results: dict[str, Any] = json.loads(source.read_text()) if source else {}
    results.setdefault("runs", {})
    todo = list(cells)
    for i, (key, run) in enumerate(todo):
        if key in results["runs"]:
            continue
        results["runs"][key] = r = run(results["runs"])
        path.write_text(json.dumps(results))
        print(f"[{i + 1}/{len(todo)}] {key}: {line(r)} ({r['seconds']:.0f} s)", flush=True)
    return results
