"""Copies of private values inside larger arrays, in order (the leak auditor's window search).

An in-order copy ``a·s + b`` of a block keeps the signs of its neighbours' differences (all of them
flipped when ``a < 0``), rounding aside. Every position of every block is indexed by the signs of
the next ``SPAN`` differences, packed into one 64-bit key, in its canonical form (the smaller of the
key and its flip, so one lookup finds either sign of ``a``). A payload array's keys are read at
every ``STRIDE``-th position and looked up. A copy of at least ``MIN_VALUES`` values holds at least
two such positions, and rounding to bfloat16 flips a sign only where neighbours differ by under 1 %
or so. Each hit is then fitted as ``a·s + b`` on the key's span, at the precision of the payload's
values. A fit that holds is grown both ways while it keeps holding, and it counts as a copy when it
reaches ``MIN_VALUES``. The cost is one pass over the payload and a sorted lookup of ``n / STRIDE``
keys.

Keys, the index and the lookup are torch int64 tensors on the auditor's device (a key uses 48 bits,
so it is never negative); only a hit's growth (``extent``) reads host memory.
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
#: a blocked Bloom filter of about 16 bits per key, at most 2**MAX_HASH_BITS bits (64 MB),
#: screens the lookups: most payload keys are in no block. A key sets two bits of one 64-bit
#: word, so that a lookup reads one word (one cache line) instead of two
MAX_HASH_BITS = 29
#: bytes of 0 or 1 times this put byte j's bit at bit 56 + j, with no carries (sign_keys)
_GATHER = 0x0102040810204080
#: the hash's odd multiplier, as int64 (the products wrap as unsigned ones would)
_SEED = 0x9E3779B97F4A7C15 - (1 << 64)


def _bloom_bits(keys: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each key's word of a ``2**bits``-bit blocked Bloom filter (``bits`` ≤ 29) and its two
    bits there, from ``keys · seed`` mod 2⁶⁴: the top ``bits - 6`` bits, then bits 35–40 and
    29–34 (the shifts are arithmetic on int64, so the sign bits they drag in are masked off)."""
    h = keys * _SEED
    return (h >> (70 - bits)) & ((1 << (bits - 6)) - 1), (h >> 35) & 63, (h >> 29) & 63


def canonical(keys: torch.Tensor) -> torch.Tensor:
    """Each key or its flip (every sign reversed: the key of ``-values``), whichever is smaller."""
    return torch.minimum(keys, ~keys & MASK)


def sign_keys(values: torch.Tensor, start: int = 0, stride: int = STRIDE) -> torch.Tensor:
    """Keys at positions ``start, start + stride, …`` (``stride`` a multiple of 8): bit t of a
    key is ``values[p + t + 1] > values[p + t]``, for t < SPAN (positions with fewer than SPAN
    differences after them get no key)."""
    v = values[start:]
    count = (len(v) - 1 - SPAN) // stride + 1
    if count <= 0:
        return torch.zeros(0, dtype=torch.int64, device=values.device)
    packed = _packed_signs(v)
    step = stride // 8
    need = (count - 1) * step + 8  # a key reads 8 bytes and keeps SPAN // 8 of them
    if len(packed) < need:
        packed = torch.cat([packed, packed.new_zeros(need - len(packed))])
    rows = packed[:need].unfold(0, 8, step)[:count]
    return rows.reshape(-1).view(torch.int64) & MASK


def _packed_signs(v: torch.Tensor) -> torch.Tensor:
    """``v[i + 1] > v[i]`` for each whole byte's worth of i, packed: byte q holds 8q … 8q + 7,
    bit j the sign 8q + j."""
    whole = (len(v) - 1) // 8 * 8
    if v.device.type == "cpu" and v.dtype in (torch.float32, torch.float64):
        # numpy's comparison and packbits: a quarter of the torch ops' time on the CPU
        x = v.numpy()
        return torch.from_numpy(np.packbits(x[1 : whole + 1] > x[:whole], bitorder="little"))
    return _packed_signs_torch(v, whole)


def _packed_signs_torch(v: torch.Tensor, whole: int) -> torch.Tensor:
    """``_packed_signs`` in torch ops, on any device."""
    ups = (v[1 : whole + 1] > v[:whole]).contiguous()  # diff(v) > 0, without the differences
    # read 8 bools as one int64 and gather its bytes' low bits into the top byte with one
    # multiplication
    eight = ups.view(torch.uint8).view(torch.int64)
    return (((eight * _GATHER) >> 56) & 0xFF).to(torch.uint8)


class WindowIndex:
    """Every in-block position of the private blocks, keyed by ``sign_keys``, on the device of
    ``blocks``; ``values`` keeps a host copy of each block for ``extent``."""

    def __init__(self, blocks: list[torch.Tensor]) -> None:
        device = blocks[0].device if blocks else torch.device("cpu")
        keys, where, owner = [], [], []
        for b, values in enumerate(blocks):
            for offset in range(8):  # every position: 8 byte-aligned sets
                k = sign_keys(values, offset, stride=8)
                keys.append(canonical(k))
                where.append(offset + 8 * torch.arange(len(k), device=device, dtype=torch.int32))
                owner.append(torch.full((len(k),), b, dtype=torch.int32, device=device))
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        self.keys, order = torch.sort(torch.cat(keys) if keys else empty, stable=True)
        self.positions = (torch.cat(where) if where else empty.int())[order]
        self.blocks = (torch.cat(owner) if owner else empty.int())[order]
        self.values = [v.cpu().numpy() for v in blocks]
        self.bits = int(min(MAX_HASH_BITS, max(6, np.ceil(np.log2(16 * len(self.keys) + 1)))))
        bloom = torch.zeros(1 << (self.bits - 3), dtype=torch.int32, device=device)
        word, *pair = _bloom_bits(self.keys, self.bits)
        h = torch.unique(torch.cat([word * 64 + b for b in pair]))  # the filter's bits to set
        bloom.index_add_(0, h >> 3, (1 << (h & 7)).int())  # each bit once: adding is or-ing
        #: bytes in memory order, read as little-endian 64-bit words (bit b of a word is bit
        #: b % 8 of its byte b // 8)
        self.bloom = bloom.to(torch.uint8).view(torch.int64)

    def _passes(self, keys: torch.Tensor) -> torch.Tensor:
        """Which ``keys`` pass the Bloom filter (every indexed key does)."""
        word, first, second = _bloom_bits(keys, self.bits)
        w = self.bloom[word]
        return ((w >> first) & (w >> second) & 1).bool()

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
        keys = canonical(keys)
        at = torch.nonzero(plain & self._passes(keys)).flatten()
        wanted = keys[at]
        lo = torch.searchsorted(self.keys, wanted)
        found: list[tuple[torch.Tensor, torch.Tensor]] = []
        last = len(self.keys) - 1
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
