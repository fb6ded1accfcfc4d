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
"""

from __future__ import annotations

import numpy as np

#: differences per key, and the payload positions read (one in STRIDE)
SPAN, STRIDE = 48, 16
_MASK = np.uint64((1 << SPAN) - 1)
#: a copy is followed this far beyond its key's span, each way, at a time
REACH = 4096
#: block positions looked at per payload key
PER_KEY = 4
#: a Bloom filter (two hashes) of about 16 bits per key, at most 2**MAX_HASH_BITS bits (64 MB),
#: screens the lookups: most payload keys are in no block
MAX_HASH_BITS = 29
_SEEDS = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))


def _hashes(keys: np.ndarray, bits: int) -> list[np.ndarray]:
    with np.errstate(over="ignore"):
        return [(keys * seed) >> np.uint64(64 - bits) for seed in _SEEDS]


def sign_keys(values: np.ndarray, start: int = 0, stride: int = STRIDE) -> np.ndarray:
    """Keys at positions ``start, start + stride, …`` (``stride`` a multiple of 8): bit t of a
    key is ``values[p + t + 1] > values[p + t]``, for t < SPAN (positions with fewer than SPAN
    differences after them get no key)."""
    ups = np.diff(values[start:]) > 0
    packed = np.packbits(ups, bitorder="little")  # byte q holds the signs at 8q … 8q + 7
    count = (len(ups) - SPAN) // stride + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    step, width = stride // 8, SPAN // 8
    keys = np.zeros(count, dtype=np.uint64)
    for byte in range(width):
        keys |= packed[byte : byte + step * count : step].astype(np.uint64) << np.uint64(8 * byte)
    return keys


class WindowIndex:
    """Every in-block position of the private blocks, keyed by ``sign_keys``."""

    def __init__(self, blocks: list[np.ndarray]) -> None:
        keys, where, owner = [], [], []
        for b, values in enumerate(blocks):
            values = np.asarray(values).reshape(-1)
            for offset in range(8):  # every position: 8 byte-aligned sets
                k = sign_keys(values, offset, stride=8)
                keys.append(k)
                where.append((offset + 8 * np.arange(len(k))).astype(np.int32))
                owner.append(np.full(len(k), b, dtype=np.int32))
        keys_all = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        order = np.argsort(keys_all, kind="stable")
        self.keys = keys_all[order]
        self.positions = (np.concatenate(where) if where else np.zeros(0, np.int32))[order]
        self.blocks = (np.concatenate(owner) if owner else np.zeros(0, np.int32))[order]
        self.values = [np.asarray(v).reshape(-1) for v in blocks]
        self.bits = int(min(MAX_HASH_BITS, max(6, np.ceil(np.log2(16 * len(self.keys) + 1)))))
        self.bloom = np.zeros(1 << (self.bits - 3), dtype=np.uint8)
        for h in _hashes(self.keys, self.bits):
            h = np.sort(h)
            byte, bit = h >> np.uint64(3), np.uint8(1) << (h & np.uint64(7)).astype(np.uint8)
            if len(h):
                firsts = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
                self.bloom[byte[firsts]] |= np.bitwise_or.reduceat(bit, firsts)

    def _maybe(self, keys: np.ndarray) -> np.ndarray:
        """False where a key is surely in no block (a Bloom filter: a few false Trues)."""
        out = np.ones(len(keys), dtype=bool)
        for h in _hashes(keys, self.bits):
            out &= (self.bloom[h >> np.uint64(3)] >> (h & np.uint64(7)).astype(np.uint8)) & 1 > 0
        return out

    def candidates(
        self, payload: np.ndarray, skip: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(payload positions, blocks, positions in block)`` whose keys agree, either sign of
        ``a`` (at most ``PER_KEY`` entries per key: a key many positions share says little).
        Payload keys equal to ``skip`` (the same positions' keys of something checked
        already) are not looked up."""
        empty = np.zeros(0, dtype=np.int64)
        if not len(self.keys) or len(payload) < SPAN + 1:
            return empty, empty, empty
        keys = sign_keys(payload)
        plain = (keys != 0) & (keys != _MASK)  # monotone runs and constants: no fingerprint
        if skip is not None:
            plain &= keys != skip[: len(keys)]
        found: list[tuple[np.ndarray, np.ndarray]] = []
        last = len(self.keys) - 1
        for probe in (keys, ~keys & _MASK):
            at = np.flatnonzero(plain & self._maybe(probe))
            lo = np.searchsorted(self.keys, probe[at])
            for extra in range(PER_KEY):
                row = np.minimum(lo + extra, last)
                take = self.keys[row] == probe[at]
                found.append((at[take], row[take]))
        at = np.concatenate([f[0] for f in found])
        row = np.concatenate([f[1] for f in found])
        return STRIDE * at, self.blocks[row].astype(np.int64), self.positions[row].astype(np.int64)


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
