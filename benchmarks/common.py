"""Shared helpers for the benchmark scripts: a machine description and ``key=value`` reporting."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
if str(ROOT) not in sys.path:  # `python benchmarks/x.py` puts benchmarks/, not the root, first
    sys.path.insert(0, str(ROOT))

from raysim.machine import cpu_model  # noqa: E402


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
