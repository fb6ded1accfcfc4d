"""Copies of private values inside larger arrays, in order (the leak auditor's window search).

An in-order copy ``a·s + b`` of a block keeps the signs of its neighbours' differences (all of
them flipped when ``a < 0``), rounding aside. Every position of every block is indexed by the
signs of the next ``SPAN`` differences, packed into one 64-bit key. A payload array's keys are
read at every ``STRIDE``-th position and looked up. A copy of at least ``MIN_VALUES`` values holds
at least two such positions, and rounding to bfloat16 flips a sign only where neighbours differ
by under 1 % or so. Each hit is then fitted as ``a·s + b`` on the key's span, at the precision of
the payload's values. A fit that holds is grown both ways while it keeps holding, and it counts
as a copy when it reaches ``MIN_VALUES``. The cost is one pass over the payload and a sorted
lookup of ``n / STRIDE`` keys.

Keys, the index and the lookup are torch int64 tensors on the auditor's device (a key uses 48
bits, so it is never negative); only a hit's growth (``extent``) reads host memory.
"""

from __future__ import annotations

import numpy as np
import torch

#: differences per key, and the payload positions read (one in STRIDE)
SPAN, STRIDE = 48, 16
MASK = (1 << SPAN) - 1
#: a copy is followed this far beyond its key's span, each way, at a time
REACH = 4096
#: block positions looked at per payload key
PER_KEY = 4
#: a Bloom filter (two hashes) of about 16 bits per key, at most 2**MAX_HASH_BITS bits (64 MB),
#: screens the lookups: most payload keys are in no block
MAX_HASH_BITS = 29
#: the hashes' odd multipliers, as int64 (the products wrap as unsigned ones would)
_SEEDS = tuple(
    s - (1 << 64) if s >= 1 << 63 else s for s in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F)
)


def _hashes(keys: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """The top ``bits`` bits of ``keys · seed`` mod 2⁶⁴, per seed (the shift is arithmetic on
    int64, so the sign bits it drags in are masked off)."""
    return [((keys * seed) >> (64 - bits)) & ((1 << bits) - 1) for seed in _SEEDS]


def sign_keys(values: torch.Tensor, start: int = 0, stride: int = STRIDE) -> torch.Tensor:
    """Keys at positions ``start, start + stride, …`` (``stride`` a multiple of 8): bit t of a
    key is ``values[p + t + 1] > values[p + t]``, for t < SPAN (positions with fewer than SPAN
    differences after them get no key)."""
    ups = torch.diff(values[start:]) > 0
    count = (len(ups) - SPAN) // stride + 1
    if count <= 0:
        return torch.zeros(0, dtype=torch.int64, device=values.device)
    bits = ups[: len(ups) // 8 * 8].view(torch.uint8).view(-1, 8)
    packed = bits[:, 0].clone()  # byte q: the signs 8q … 8q + 7, bit j the sign 8q + j
    for j in range(1, 8):
        packed |= bits[:, j] << j
    step = stride // 8
    keys = packed[: step * count : step].long()
    for byte in range(1, SPAN // 8):
        keys |= packed[byte : byte + step * count : step].long() << (8 * byte)
    return keys


class WindowIndex:
    """Every in-block position of the private blocks, keyed by ``sign_keys``, on the device of
    ``blocks``; ``values`` keeps a host copy of each block for ``extent``."""

    def __init__(self, blocks: list[torch.Tensor]) -> None:
        device = blocks[0].device if blocks else torch.device("cpu")
        keys, where, owner = [], [], []
        for b, values in enumerate(blocks):
            for offset in range(8):  # every position: 8 byte-aligned sets
                k = sign_keys(values, offset, stride=8)
                keys.append(k)
                where.append(offset + 8 * torch.arange(len(k), device=device, dtype=torch.int32))
                owner.append(torch.full((len(k),), b, dtype=torch.int32, device=device))
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        self.keys, order = torch.sort(torch.cat(keys) if keys else empty, stable=True)
        self.positions = (torch.cat(where) if where else empty.int())[order]
        self.blocks = (torch.cat(owner) if owner else empty.int())[order]
        self.values = [v.cpu().numpy() for v in blocks]
        self.bits = int(min(MAX_HASH_BITS, max(6, np.ceil(np.log2(16 * len(self.keys) + 1)))))
        bloom = torch.zeros(1 << (self.bits - 3), dtype=torch.int32, device=device)
        h = torch.unique(torch.cat(_hashes(self.keys, self.bits)))
        bloom.index_add_(0, h >> 3, (1 << (h & 7)).int())  # each bit once: adding is or-ing
        self.bloom = bloom.to(torch.uint8)

    def _maybe(self, keys: torch.Tensor) -> torch.Tensor:
        """False where a key is surely in no block (a Bloom filter: a few false Trues)."""
        out = torch.ones(len(keys), dtype=torch.uint8, device=keys.device)
        for h in _hashes(keys, self.bits):
            out &= torch.index_select(self.bloom, 0, h >> 3) >> (h & 7).to(torch.uint8)
        return (out & 1).bool()

    def candidates(
        self, payload: torch.Tensor, skip: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(payload positions, blocks, positions in block)`` whose keys agree, either sign of
        ``a`` (at most ``PER_KEY`` entries per key: a key many positions share says little).
        Payload keys equal to ``skip`` (the same positions' keys of something checked
        already) are not looked up."""
        empty = torch.zeros(0, dtype=torch.int64, device=payload.device)
        if not len(self.keys) or len(payload) < SPAN + 1:
            return empty, empty, empty
        keys = sign_keys(payload)
        plain = (keys != 0) & (keys != MASK)  # monotone runs and constants: no fingerprint
        if skip is not None:
            plain &= keys != skip[: len(keys)]
        found: list[tuple[torch.Tensor, torch.Tensor]] = []
        last = len(self.keys) - 1
        for probe in (keys, ~keys & MASK):
            at = torch.nonzero(plain & self._maybe(probe)).flatten()
            wanted = probe[at]
            lo = torch.searchsorted(self.keys, wanted)
            for extra in range(PER_KEY):
                row = (lo + extra).clamp_max(last)
                take = self.keys[row] == wanted
                found.append((at[take], row[take]))
        at = torch.cat([f[0] for f in found])
        row = torch.cat([f[1] for f in found])
        return STRIDE * at, self.blocks[row].long(), self.positions[row].long()


def extent(
    payload: np.ndarray, values: np.ndarray, at: int, start: int, a: float, b: float, u: float
) -> tuple[int, int]:
    """How far the copy ``payload[at + i] ≈ a·values[start + i] + b`` runs around its key's span:
    ``(first i, length)``, residuals judged as in ``fit``. Followed ``REACH`` values each way at
    a time, further while the copy reaches the edge of what was read."""
    spread = float(np.std(payload[at : at + SPAN + 1].astype(np.float64)))
    reach = REACH
    while True:
        left = min(at, start, reach)
        right = min(len(payload) - at, len(values) - start, reach + SPAN + 1)
        t = payload[at - left : at + right].astype(np.float64)
        s = values[start - left : start + right].astype(np.float64)
        ok = np.abs(t - (a * s + b)) <= 2 * u * (np.abs(t) + abs(b)) + u * spread
        bad_before = np.flatnonzero(~ok[:left])
        bad_after = np.flatnonzero(~ok[left + SPAN + 1 :])
        lo = int(bad_before[-1]) + 1 if len(bad_before) else 0
        hi = left + SPAN + 1 + int(bad_after[0]) if len(bad_after) else len(ok)
        clipped = (lo == 0 and left == reach) or (hi == len(ok) and right == reach + SPAN + 1)
        if not clipped:
            return lo - left, hi - lo
        reach *= 4
