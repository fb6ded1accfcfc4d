"""What machine this is, in words (for benchmark and reproduction reports), and where raysim keeps
what it makes once per machine."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_home() -> Path:
    """raysim's per-machine cache (``$RAYSIM_CACHE``, else ``~/.cache/raysim``): what is made
    once and reused, such as converted model weights and the empty MLflow store."""
    return Path(os.environ.get("RAYSIM_CACHE") or Path.home() / ".cache" / "raysim")
