"""Working memory kept between calls for the server's vector arithmetic (the FedBaF mix).

A large tensor made fresh on the CPU is mapped afresh, and its first write faults every page in:
about 10 ms per 44 MB (11 M float32 values) on the 2-vCPU machine, as long as the arithmetic
itself. A kept buffer pays that once. On a GPU, torch's caching allocator already reuses memory.
This module loads without torch, so that ``prefer_huge_pages`` can run before torch does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def prefer_huge_pages() -> None:
    """Ask torch to back its CPU tensors of 2 MB and more with transparent huge pages (its
    ``THP_MEM_ALLOC_ENABLE``), which halves a fresh model-sized tensor's first-touch cost on
    the 2-vCPU machine (benchmarks/RESULTS.md). It takes effect only before torch's first
    allocation in the process: the coordinator calls it first thing. A value already in the
    environment is kept (``0`` opts out)."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


class Buffers:
    """Named 1-D buffers, each grown when a call needs more than it holds. Kept on the CPU only:
    elsewhere (a GPU) each call gets a new tensor from torch's caching allocator, which reuses
    freed memory itself, so no model-sized buffer stays reserved there between calls."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        import torch

        self.device = torch.device(device)
        self._empty, self._float32 = torch.empty, torch.float32
        self._kept: dict[str, torch.Tensor] = {}

    def get(self, name: str, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``n`` values of buffer ``name`` (of ``dtype``, float32 by default); their contents
        are stale."""
        dtype = dtype or self._float32
        if self.device.type != "cpu":
            return self._empty(n, dtype=dtype, device=self.device)
        buf = self._kept.get(name)
        if buf is None or buf.dtype != dtype or buf.numel() < n:
            buf = self._empty(n, dtype=dtype, device=self.device)
            self._kept[name] = buf
        return buf[:n]
