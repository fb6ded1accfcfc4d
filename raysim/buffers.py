"""Working memory kept between calls for the server's vector arithmetic (the FedBaF mix, the leak
auditor).

A large tensor made fresh on the CPU is mapped afresh, and its first write faults every page in:
about 10 ms per 44 MB (11 M float32 values) on the 2-vCPU machine, as long as the arithmetic
itself. A kept buffer pays that once. On a GPU, torch's caching allocator already reuses memory.
"""

from __future__ import annotations

import torch


class Buffers:
    """Named 1-D buffers on one device, each grown when a call needs more than it holds."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._kept: dict[str, torch.Tensor] = {}

    def get(self, name: str, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The first ``n`` values of buffer ``name`` (of ``dtype``); their contents are stale."""
        buf = self._kept.get(name)
        if buf is None or buf.dtype != dtype or buf.numel() < n:
            buf = torch.empty(n, dtype=dtype, device=self.device)
            self._kept[name] = buf
        return buf[:n]
