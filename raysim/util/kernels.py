"""Portable CPU kernels: the same floats on any x86 CPU, for weights that must reproduce across
machines (a pre-trained foundation, issue 62).

A CPU's own kernels (AVX2 or AVX-512, MKL's code path for it, the thread count) round floats in
their own order, and thousands of optimiser steps carry that into other weights: the same code
and seeds pre-train a different foundation on another machine. Pinned, ATen runs its default
(non-AVX) kernels, MKL its conditional-numerical-reproducibility path, oneDNN its SSE4.1 code
and torch one thread; slower, and meant to give the same bits on every x86 CPU those libraries
support (checked on one CPU kind so far, also posing as an older one without AVX or FMA:
``benchmarks/foundation_digest.py`` compares another).
"""

from __future__ import annotations

import os
import sys
from typing import Literal

Kernels = Literal["portable", "native"]

#: read once by torch, MKL and oneDNN as they load: set before the first ``import torch``
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
}


class KernelsError(ValueError):
    """Portable kernels asked of a process whose torch already runs others."""


def request_portable_kernels() -> None:
    """Set ``PORTABLE_ENV`` for this process where torch is not loaded yet (a no-op after:
    ``check_kernels`` then says whether it took)."""
    if "torch" not in sys.modules:
        os.environ.update(PORTABLE_ENV)


def check_kernels(kernels: Kernels) -> dict[str, object]:
    """Make this process's torch use ``kernels`` and say what it runs; ``portable`` needs the
    environment of ``request_portable_kernels`` from before torch loaded, and refuses otherwise
    (naming how to get it) rather than pre-train weights that only look portable."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    if kernels == "portable":
        missing = {k: v for k, v in PORTABLE_ENV.items() if os.environ.get(k) != v}
        if capability != "DEFAULT" or missing:
            raise KernelsError(
                f"portable kernels: torch was loaded with {capability} kernels"
                + (
                    f" and without {', '.join(f'{k}={v}' for k, v in missing.items())}"
                    if missing
                    else ""
                )  # fmt: skip
                + "; pre-train in a fresh process (`raysim pretrain`, which sets them) or set "
                "them before importing torch"
            )
        torch.set_num_threads(1)
    return {
        "kernels": kernels,
        "cpu_capability": capability,
        "torch_threads": torch.get_num_threads(),
        **{k: os.environ.get(k, "") for k in PORTABLE_ENV},
    }
