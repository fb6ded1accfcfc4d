"""Exact copies of private values inside larger arrays: whole blocks in order (``ExactCopies``,
FedBaF spec §6.3 (ii)) and runs of private values in any order (``ValueIndex``, the leak auditor's
last search, ``LeakAuditor._reordered_inside``).

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
#: the bitmap's bits for one sign (BINADES is a power of two, so the sign's bit is one above)
_HALF = BINADES << 23
#: a value that occurs this often among the blocks (a constant, an initial value) is no evidence
COMMON = 8
#: payload values looked up at a time while a run is followed
CHUNK = 4096
#: a block's first HEAD words: any copy of the block puts exactly one of them at a multiple of
#: HEAD (``ExactCopies``)
HEAD = 16
#: candidate positions paired with the blocks' heads at a time
PAIRS = 1024


class ExactCopies:
    """Whole blocks (float32 words as int32, each at least ``HEAD`` long) sitting contiguously in
    a payload, found by reading one payload position in ``HEAD``: a copy puts exactly one of its
    block's first ``HEAD`` words there. The position's low 16 bits index a table of the heads'
    (about n/16 · 16k/65536 candidates for k blocks), the few that pass are compared on the
    whole word, then on the block's first ``HEAD`` words, and only then on the whole block."""

    def __init__(self, blocks: list[torch.Tensor]) -> None:
        device = blocks[0].device if blocks else torch.device("cpu")
        self.blocks = blocks
        self.lengths = torch.as_tensor([len(b) for b in blocks], device=device, dtype=torch.int64)
        self.heads = (
            torch.stack([b[:HEAD] for b in blocks])
            if blocks
            else torch.zeros((0, HEAD), dtype=torch.int32, device=device)
        )
        self.head_words = self.heads.reshape(-1)
        self.table = torch.zeros(1 << 16, dtype=torch.uint8, device=device)
        self.table[(self.head_words & 0xFFFF).long()] = 1

    def find(self, words: torch.Tensor) -> int | None:
        """Index of a block whose words sit contiguously in ``words`` (int32), or None."""
        if not self.blocks:
            return None
        sampled = words[::HEAD].contiguous()
        marked = torch.index_select(self.table, 0, (sampled & 0xFFFF).long())
        at = torch.nonzero(marked).flatten()
        at = at[torch.isin(sampled[at], self.head_words)]
        span = torch.arange(HEAD, device=words.device)
        for lo in range(0, len(at), PAIRS):
            chunk = at[lo : lo + PAIRS]
            pos, entry = torch.nonzero(sampled[chunk, None] == self.head_words[None]).unbind(1)
            k, j = entry // HEAD, entry % HEAD
            start = chunk[pos] * HEAD - j
            inside = (start >= 0) & (start + self.lengths[k] <= len(words))
            start, k = start[inside], k[inside]
            rows = words[start[:, None] + span]  # inside: a block holds HEAD words or more
            same = (rows == self.heads[k]).all(1)
            for s, b in zip(start[same].tolist(), k[same].tolist(), strict=True):
                if torch.equal(words[s : s + len(self.blocks[b])], self.blocks[b]):
                    return b
        return None


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
        bits, inside = self._bits(words.to(torch.int32))
        bits = bits[inside].long()
        self.bitmap = torch.zeros((2 * BINADES) << 20, dtype=torch.uint8, device=values.device)
        # each bit once: a byte's sum is the OR of its bits
        self.bitmap.index_add_(0, bits >> 3, (1 << (bits & 7)).to(torch.uint8))

    def _bits(self, words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each float32 pattern's (int32) bit in the bitmap (int32: the bitmap has 2²⁸ bits;
        the negative values' half second), and whether its exponent is among the bitmap's
        (elsewhere the bit is a valid one that says nothing)."""
        rel = (words & 0x7FFFFFFF) - (self.lowest << 23)  # the pattern less the lowest's
        inside = (rel >= 0) & (rel < _HALF)
        bit = rel | ((words >> 31) & _HALF)  # the shift is arithmetic: all ones if negative
        return bit.clamp_(0, 2 * _HALF - 1), inside

    def holds(self, words: torch.Tensor) -> torch.Tensor:
        """Whether each float32 pattern (int32) is a private value's."""
        bit, inside = self._bits(words)
        found = self.bitmap[bit >> 3] >> (bit & 7).to(torch.uint8)
        return inside & (found & 1).bool()

    def first_run(self, t: torch.Tensor, least: int) -> tuple[int, torch.Tensor] | None:
        """The first run of at least ``least`` positions of ``t`` holding distinct private
        values: (its first position, its float32 patterns), or None."""
        words = float32_words(t)
        per = least // STRIDE  # sampled positions every such run holds, consecutive
        sampled = self.holds(words[::STRIDE].contiguous())
        if len(sampled) < per:
            return None
        full = sampled[: len(sampled) - per + 1].clone()  # sampled positions i … i + per - 1
        for k in range(1, per):
            full &= sampled[k : len(sampled) - per + 1 + k]
        starts = torch.nonzero(full).flatten()
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
