"""Exact copies of private values in any order inside larger arrays (the leak auditor's last
search, ``LeakAuditor._reordered_inside``).

A reordered copy has no order to index, and its boundaries inside a larger array are unknown, so
it is found by its values. The blocks' float32 values are marked in a bitmap over the float32
bit patterns of the ``BINADES`` consecutive exponents that hold most of them (32 MB; values
outside, and values that repeat ``COMMON`` times or more, such as zeros or a constant, say
nothing). A payload's values are looked up at every ``STRIDE``-th position: a run of
``MIN_VALUES`` private values holds ``MIN_VALUES / STRIDE`` consecutive sampled ones. Only there is
the payload looked up in full and its runs of private values measured. A run of ``MIN_VALUES``
distinct private values is a copy. Chance does not make one: a float32 weight equals some
private value of the same scale with probability p (about 0.1–0.3 for 11 M private values), and
64 in a row happen with probability p⁶⁴.

Only exact values are found: the payload's float32 values (float64 ones that are float32
values). A reordered copy that is rounded, scaled or shifted inside a larger array is not
(docs/leak-auditor.md). The bitmap and the lookups are torch tensors on the auditor's device.
"""

from __future__ import annotations

import torch

#: payload positions looked up first (one in STRIDE)
STRIDE = 16
#: consecutive float32 exponents the bitmap covers (2 signs × 2²³ patterns each: 32 MB)
BINADES = 16
#: a value that occurs this often among the blocks (a constant, an initial value) is no evidence
COMMON = 8
#: payload values looked up at a time while a run is followed
CHUNK = 4096


class ValueIndex:
    """Which float32 bit patterns are private values: a bitmap over ``BINADES`` exponents."""

    def __init__(self, values: torch.Tensor) -> None:
        words, counts = torch.unique(float32_words(values), return_counts=True)
        words = words[(counts < COMMON) & ((words & 0x7FFFFFFF) != 0)]
        exponents = ((words >> 23) & 0xFF).long()
        per = torch.bincount(exponents, minlength=256 + BINADES)
        window = torch.cumsum(per, 0)
        window[BINADES:] = window[BINADES:] - window[:-BINADES].clone()
        self.lowest = max(0, int(torch.argmax(window)) - BINADES + 1)
        bits = self._bit(words.to(torch.int32))
        bits = bits[bits >= 0].long()
        self.bitmap = torch.zeros((2 * BINADES) << 20, dtype=torch.uint8, device=values.device)
        # each bit once: a byte's sum is the OR of its bits
        self.bitmap.index_add_(0, bits >> 3, (1 << (bits & 7)).to(torch.uint8))

    def _bit(self, words: torch.Tensor) -> torch.Tensor:
        """Each float32 pattern's (int32) bit in the bitmap (int32: the bitmap has 2²⁸ bits), or
        -1 outside its exponents."""
        high = (words >> 23) & 0x1FF  # the sign, then the exponent
        offset = (high & 0xFF) - self.lowest
        inside = (offset >= 0) & (offset < BINADES)
        bit = (((high >> 8) * BINADES + offset.clamp(0, BINADES - 1)) << 23) | (words & 0x7FFFFF)
        return torch.where(inside, bit, -1)

    def holds(self, words: torch.Tensor) -> torch.Tensor:
        """Whether each float32 pattern (int32) is a private value's."""
        bit = self._bit(words)
        found = torch.index_select(self.bitmap, 0, (bit >> 3).clamp_min(0)) >> (bit & 7)
        return (bit >= 0) & ((found & 1) == 1)

    def first_run(self, t: torch.Tensor, least: int) -> tuple[int, torch.Tensor] | None:
        """The first run of at least ``least`` positions of ``t`` holding distinct private
        values: (its first position, its float32 patterns), or None."""
        words = float32_words(t)
        per = least // STRIDE  # sampled positions every such run holds, consecutive
        sampled = self.holds(words[::STRIDE].contiguous()).to(torch.int32)
        if len(sampled) < per:
            return None
        total = torch.cumsum(sampled, 0)
        full = total[per - 1 :] - torch.cat([total.new_zeros(1), total[:-per]])
        starts = torch.nonzero(full == per).flatten()
        if not len(starts):
            return None
        # each candidate's neighbourhood at once: a run of ``least`` needs that many private
        # values there (chance leaves a few hundred candidates in 11 M values, none passing)
        span = torch.arange((per + 2) * STRIDE, device=words.device)
        near = ((starts - 1).clamp_min(0) * STRIDE)[:, None] + span
        near = near.clamp_max(len(words) - 1)
        private = self.holds(words[near.flatten()]).view(near.shape).sum(1)
        starts = starts[private >= least].tolist()
        reached = 0  # payload positions up to here are measured already
        for i in starts:
            lo = max((i - 1) * STRIDE, reached, 0)
            if lo >= (i + per) * STRIDE:
                continue
            hi = min(len(words), (i + per + 1) * STRIDE)
            member = self.holds(words[lo:hi])
            while hi < len(words) and bool(member[-1]):  # a long run: follow it
                more = self.holds(words[hi : hi + CHUNK])
                member, hi = torch.cat([member, more]), min(len(words), hi + CHUNK)
            reached = hi
            for start, end in _true_runs(member, least):
                held = words[lo + start : lo + end]
                if len(torch.unique(held)) >= least:
                    return lo + start, held
        return None


def _true_runs(member: torch.Tensor, least: int) -> list[tuple[int, int]]:
    """(start, end) of the runs of True in ``member`` at least ``least`` long."""
    zero = member.new_zeros(1, dtype=torch.int8)
    edges = torch.diff(member.to(torch.int8), prepend=zero, append=zero)
    starts = torch.nonzero(edges == 1).flatten().tolist()
    ends = torch.nonzero(edges == -1).flatten().tolist()
    return [(s, e) for s, e in zip(starts, ends, strict=True) if e - s >= least]


def float32_words(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values as float32 bit patterns (int32); a value float32 cannot hold exactly (a
    float64 one) becomes 0, which no bitmap holds."""
    f = x.to(torch.float32)
    words = f.view(torch.int32)
    if x.dtype == torch.float64:
        words = torch.where(f.double() == x, words, torch.zeros_like(words))
    return words
