"""The leak auditor: every payload the coordinator sends to clients is checked against the
strategy's server-private blocks (``Strategy.secrets``), as FedBaF spec §6.3 asks, knowing no paper.

A payload leaks a block (of ``MIN_VALUES`` values or more) when one of its float arrays (numpy
float16/32/64, or a torch tensor of any float dtype, bfloat16 included):

- **at the block's own coordinates** (an array shaped like the global vector), or
- **as a whole array**, against the block or any contiguous sub-block of its length,

equals the block's values after a map ``a·s + b`` (``a ≠ 0``), in their order, reversed or in any
order; or when the block's float32 bytes occur anywhere in the payload (an exact copy in a
window, §6.3 (ii)), or 64 of its exact values in a row in any order (``audit_values``).
"Equals" is judged value by value, at the precision the payload's values use
(``significand_bits``: 8 bits for bfloat16, 11 for float16, also for such values inside a
float32 array): a copy rounded to float16 or bfloat16, scaled, shifted or reordered is caught,
and a model that is merely close to the foundation (FedBaF's mixed broadcast) is not. A
reordered match must also beat chance: the residual must be far below what an unrelated sample
of the same distribution would leave. What it cannot catch: docs/leak-auditor.md.

Arithmetic runs in torch on the server's device (``ServerContext.device``), in float32 with
float64 sums (float64 where a payload or a secret is float64). A reachable
reference cannot happen: private tensors refuse to be pickled (``PrivateTensors``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raysim.algorithms.base import Secret
from raysim.errors import LeakError
from raysim.security.audit_values import ExactCopies, ValueIndex, float32_words
from raysim.security.audit_windows import SPAN, WindowIndex, extent, sign_keys

MIN_VALUES = 64  # FedBaF spec §6.3: blocks of 64 values or more
#: the unit roundoff of bfloat16: a shift below it (relative to the spread) is reported as 0
U_BF16 = 2.0**-8
#: a fit explains a copy: its residual's RMS is at most this fraction of the payload's spread
EXPLAINED = 0.1
#: candidate sub-blocks checked in full per array and sign of ``a``: the nearest by moments,
#: and up to MAX_CANDIDATES where the payload's rounding blurs its moments
CANDIDATES, MAX_CANDIDATES = 8, 512
#: a reordered match counts where twice the rounding is at most GATE/√m of the spread (two
#: samples of one distribution differ by about 1/√m of it; tests/test_audit.py measures chance)
GATE = 0.25
#: values in the strided sample a fit tries first
SAMPLE = 256
#: significand bits of the floats an array's values may have been rounded to, coarsest first
PRECISIONS = (8, 11, 24, 53)
#: values summed in their own dtype before the float64 sum (``_sum64``)
SUM_CHUNK = 4096


@dataclass(frozen=True)
class Match:
    """How a payload array equals a private block: ``t ≈ a·s + b`` in the given order."""

    a: float
    b: float
    order: str  # "in order" | "reversed" | "reordered" | "transposed"
    spread: float = 0.0  # the payload's standard deviation

    def describe(self) -> str:
        """`` (as 2·x + 0.5, reversed)``, to 3 digits; a shift below bfloat16's rounding of the
        payload's spread reads 0; an exact copy reads nothing."""
        if self.a == 1.0 and self.b == 0.0 and self.order == "in order":
            return ""
        b = 0.0 if abs(self.b) <= U_BF16 * self.spread else self.b
        return f" (as {self.a:.3g}·x {'+' if b >= 0 else '−'} {abs(b):.3g}, {self.order})"


def _arrays(payload: Any) -> Iterable[np.ndarray | torch.Tensor]:
    if isinstance(payload, (np.ndarray, torch.Tensor)):
        yield payload
    elif isinstance(payload, Mapping):
        for v in payload.values():
            yield from _arrays(v)
    elif isinstance(payload, (list, tuple)):
        for v in payload:
            yield from _arrays(v)


def significand_bits(t: torch.Tensor) -> int:
    """Bits of precision ``t``'s values use: 8 (bfloat16), 11 (float16), 24 or 53; a float32
    array of float16-rounded values counts as 11. A sample is read first: most arrays use all
    of their dtype's bits, and the whole array is read only where the sample says fewer."""
    head = int(_row_bits(t[None, :SAMPLE])[0])
    return head if head >= 24 else int(_row_bits(t[None])[0])


def moments(x: torch.Tensor) -> tuple[float, float]:
    """(skewness, kurtosis) of ``x``: unchanged by any reordering and by ``a·x + b`` with
    a > 0 (the skewness flips its sign for a < 0)."""
    c = x - x.mean()
    m2 = float((c * c).mean())
    if m2 == 0.0:
        return 0.0, 0.0
    return float((c**3).mean()) / m2**1.5, float((c**4).mean()) / m2**2


def fit(s: torch.Tensor, t: torch.Tensor, u: float) -> tuple[float, float] | None:
    """``(a, b)`` when ``t`` equals ``a·s + b`` value by value at unit roundoff ``u`` (each
    residual at most ``2u·(|t| + |b|) + u·std(t)``) and the fit explains ``t``; else None.
    A strided sample is tried first: a copy passes it too, and most non-copies fail it."""
    if len(t) > 4 * SAMPLE:
        pick = torch.linspace(0, len(t) - 1, SAMPLE, device=t.device).long()
        if _fit(s[pick], t[pick], u) is None:
            return None
    return _fit(s, t, u)


def _fit(s: torch.Tensor, t: torch.Tensor, u: float) -> tuple[float, float] | None:
    u_row = torch.full((1,), u, dtype=torch.float64, device=t.device)
    ok, a, b = _pairs_fit(s[None], t[None], u_row)
    return (float(a[0]), float(b[0])) if bool(ok[0]) else None


@dataclass(frozen=True)
class Summary:
    """Mean, spread and extremes of a block or an array: what a reordered copy must share."""

    mean: float
    std: float
    low: float
    high: float

    @classmethod
    def of(cls, x: torch.Tensor) -> Summary:
        return cls(*_stats(x).tolist())

    def beats_chance(self, m: int, u: float) -> bool:
        """Whether a reordered match of these ``m`` values at unit roundoff ``u`` can be told
        from chance: sorted values of two samples of one distribution differ by about std/√m,
        so twice the rounding must be at most GATE/√m of the spread."""
        if self.std == 0.0:
            return False
        reach = (max(abs(self.low), abs(self.high)) + abs(self.mean)) / self.std
        return 2 * u * reach <= GATE / m**0.5

    def could_reorder(self, mean: float, low: float, high: float, u: float) -> bool:
        """Whether values with this mean and these extremes could be ``a·x + b`` of this block's
        values ``x`` reordered, at unit roundoff ``u``: the map that takes the block's extremes
        onto them must take its mean onto theirs. A copy's rounding moves each side by at most
        about 12·u·(|extreme| + |b|); this allows 16 (it only screens: ``matches`` decides)."""
        if self.high == self.low or high == low:
            return False
        for a, b in _extremes_maps(self.low, self.high, low, high):
            if abs(a * self.mean + b - mean) <= 16 * u * (max(abs(low), abs(high)) + abs(b)):
                return True
        return False

    def could_be(self, s: Summary, u: float) -> bool:
        """Whether these values could be ``a·s + b`` reordered, at unit roundoff ``u``: the
        extremes map onto each other under the ``a`` and ``b`` that the spreads and means give."""
        if s.std == 0.0 or self.std == 0.0:
            return False
        reach = max(abs(self.low), abs(self.high)) + self.std
        for sign in (1.0, -1.0):
            a = sign * self.std / s.std
            b = self.mean - a * s.mean
            low, high = sorted((a * s.low + b, a * s.high + b))
            tol = 8 * u * (reach + abs(b))
            if abs(low - self.low) <= tol and abs(high - self.high) <= tol:
                return True
        return False


def matches(
    s: torch.Tensor,
    t: torch.Tensor,
    bits: int,
    s_summary: Summary | None = None,
    in_order: bool = True,
) -> Match | None:
    """How ``t`` equals block values ``s`` (same length), if it does, at the ``bits`` of
    precision ``t``'s values use: in order, reversed, or reordered (sorted values; only where
    that precision makes a match beat chance)."""
    u = 2.0**-bits
    for order, ref in (("in order", s), ("reversed", s.flip(0)))[0 if in_order else 1 :]:
        ab = fit(ref, t, u)
        if ab is not None:
            return Match(*ab, order, float(t.std()))
    mine = Summary.of(t)
    if not mine.beats_chance(len(t), u) or not mine.could_be(s_summary or Summary.of(s), u):
        return None
    t_sorted = t.sort().values
    for ref in (s.sort().values, s.sort(descending=True).values):
        ab = _fit(ref, t_sorted, u)
        if ab is not None:
            return Match(*ab, "reordered", mine.std)
    return None


class LeakAuditor:
    """Checks payloads against ``secrets``; a leak raises ``LeakError`` naming block and payload.
    It holds the blocks' values (and tables made from them), so it refuses to be pickled."""

    def __reduce__(self):  # noqa: D105
        from raysim.algorithms.base import REFUSAL, PrivateStateError

        raise PrivateStateError(REFUSAL)

    def __init__(
        self,
        secrets: list[Secret],
        size: int,
        device: torch.device | str = "cpu",
        windows: bool = True,
        transposes: bool = True,
    ) -> None:
        self.secrets = [s for s in secrets if s.values.size and np.any(s.values != 0)]
        self.size = size
        self.device = torch.device(device)
        self.windows = windows  # the search inside larger arrays (``_windows``)
        self.transposes = transposes  # which also looks for 2-D blocks' transposes
        self.checked = 0
        #: small blocks: checked exactly at their own coordinates, as before §6.3's threshold
        self.small = [
            (
                s.name,
                torch.as_tensor(np.asarray(s.indices, np.int64).reshape(-1), device=self.device),
                torch.as_tensor(np.asarray(s.values, np.float64).reshape(-1), device=self.device),
            )
            for s in self.secrets
            if s.values.size < MIN_VALUES
        ]
        big = [s for s in self.secrets if s.values.size >= MIN_VALUES]
        self.names = [s.name for s in big]
        wide = any(np.asarray(s.values).dtype == np.float64 for s in big)
        dtype = np.float64 if wide else np.float32  # float64 only where a secret is
        values = [np.asarray(s.values, dtype).reshape(-1) for s in big]
        indices = [np.asarray(s.indices, np.int64).reshape(-1) for s in big]
        self.values = torch.as_tensor(
            np.concatenate(values) if big else np.zeros(0), device=self.device
        )
        self.indices = torch.as_tensor(
            np.concatenate(indices) if big else np.zeros(0, np.int64), device=self.device
        )
        sizes = [s.values.size for s in big]
        self.ends = np.cumsum(sizes).astype(np.int64)
        self.starts = self.ends - np.asarray(sizes, dtype=np.int64)
        self.starts_t = torch.as_tensor(self.starts, device=self.device)
        self.ends_t = torch.as_tensor(self.ends, device=self.device)
        #: ``_screen``'s sample: its global coordinates, the block's values there and reversed
        self._samples: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.block = torch.as_tensor(
            np.repeat(np.arange(len(big)), sizes), device=self.device, dtype=torch.int64
        )
        self.longest = int(max(sizes, default=0))
        #: (block, rows, columns) of each 2-D block whose transpose ``_windows`` also looks for
        self.shapes_2d = [
            (i, int(s.shape[0]), int(s.shape[1]))
            for i, s in enumerate(big)
            if transposes and _matrix(s.shape, s.values.size)
        ]
        self._sequences: _Sequences | None = None  # built with the index
        self._sums: list[torch.Tensor] | None = None
        self._index: WindowIndex | None = None  # built at the first array long enough
        self._value_index: ValueIndex | None = None  # likewise
        self._own: torch.Tensor | None = None
        self.summaries = [
            Summary.of(self.values[lo:hi]) for lo, hi in zip(self.starts, self.ends, strict=True)
        ]
        #: (first, end) where a block's coordinates are one run of the global vector (a slice
        #: reads them without a copy), else None
        self.spans = [_span(np.asarray(s.indices).reshape(-1)) for s in big]
        #: each block's float32 words, for exact copies anywhere (§6.3 (ii))
        self.words = [
            np.ascontiguousarray(s.values, dtype=np.float32).view(np.uint32).reshape(-1)
            for s in big
        ]
        #: the same words on the device, indexed by their first words (``ExactCopies``)
        with warnings.catch_warnings():  # the secrets are read-only; these only read them
            warnings.simplefilter("ignore", UserWarning)
            self.exact = ExactCopies(
                [torch.as_tensor(w.view(np.int32), device=self.device) for w in self.words]
            )

    # ------------------------------------------------------------------------------- public
    def check(self, payload: Any, where: str) -> None:
        for a in _arrays(payload):
            self.checked += 1
            self._check_array(a, where)

    def _check_array(self, a: np.ndarray | torch.Tensor, where: str) -> None:
        flat = a.reshape(-1)
        if not _is_float(a):
            hit = self._bytes_hit(np.asarray(a))
            if hit is not None:
                raise LeakError(f"stopped: {where} carries the server-private {hit}'s bytes")
            return
        t = _as_tensor(flat, self.device)
        own = tuple(a.shape) == (self.size,)
        if own:
            for name, idx, ref in self.small:
                if torch.allclose(t[idx].double(), ref, rtol=1e-6, atol=0):
                    raise LeakError(f"stopped: {where} carries the server-private {name}")
            self._own_coordinates(t, where)
        elif MIN_VALUES <= len(t) <= self.longest:
            self._whole(t, where)
        if isinstance(a, np.ndarray) and a.dtype == np.float32 and self.words:
            k = self.exact.find(t.view(torch.int32))
            hit = None if k is None else self.names[k]
            if hit is not None:
                raise LeakError(f"stopped: {where} carries the server-private {hit}'s bytes")
        if self.windows and len(t) >= MIN_VALUES and self.names:
            self._windows(t, where, own)
            self._reordered_inside(t, where)

    # ----------------------------------------------------------------- at own coordinates
    def _own_coordinates(self, t: torch.Tensor, where: str) -> None:
        """The payload's values at each block's coordinates (``matches``), every block screened
        at once first (``_screen``): only a block the screen keeps is checked on its own."""
        for i in self._screen(t):
            x = self._at_own(t, i)
            lo, hi = int(self.starts[i]), int(self.ends[i])
            hit = matches(self.values[lo:hi], x, significand_bits(x), self.summaries[i])
            if hit is not None:
                self._raise(i, hit, where)

    def _screen(self, t: torch.Tensor) -> list[int]:
        """Blocks whose values at their own coordinates in ``t`` could match, all blocks at once
        and read back in one transfer: a ``SAMPLE``-value strided sample of each must fit in
        order or reversed (what ``fit`` asks of a copy first), or the values' mean and extremes
        must allow a reordered copy (``Summary.could_reorder``). A sample whose values use fewer
        bits than float32's sends its block on."""
        if self._samples is None:
            sizes = torch.as_tensor(self.ends - self.starts, device=self.device)
            steps = torch.linspace(0, 1, SAMPLE, dtype=torch.float64, device=self.device)
            offsets = (steps[None] * (sizes[:, None] - 1)).long()
            ahead, back = self.starts_t[:, None] + offsets, self.ends_t[:, None] - 1 - offsets
            self._samples = self.indices[ahead], self.values[ahead], self.values[back]
        where, ahead, back = self._samples
        rows = t[where]
        bits = _row_bits(rows)
        u = 2.0**-bits
        ok = _pairs_fit(ahead, rows, u)[0] | _pairs_fit(back, rows, u)[0]
        stats = [
            torch.stack(_mean_and_extremes(self._at_own(t, i))) for i in range(len(self.names))
        ]
        table = torch.cat([torch.stack([ok.double(), bits], 1), torch.stack(stats)], 1).tolist()
        return [
            i
            for i, (fits, b, mean, low, high) in enumerate(table)
            if fits or b < 24 or self.summaries[i].could_reorder(mean, low, high, 2.0**-b)
        ]

    def _at_own(self, t: torch.Tensor, i: int) -> torch.Tensor:
        """``t``'s values at block ``i``'s coordinates (a slice where they are one run)."""
        span = self.spans[i]
        if span is not None:
            return t[span[0] : span[1]]
        return t[self.indices[int(self.starts[i]) : int(self.ends[i])]]

    # ------------------------------------------------------------------ as a whole array
    def _whole(self, t: torch.Tensor, where: str) -> None:
        """``t`` against every window of its length inside one block: the windows' moments
        from prefix sums (one pass over the blocks), then the nearest few by moments in full."""
        m = len(t)
        if float(t.std()) == 0.0:
            return
        skew, kurt = moments(t)
        w = [(q[m:] - q[:-m]) / m for q in self._power_sums()]  # windows' means of powers
        mu = w[0]
        m2 = (w[1] - mu**2).clamp_min(0)
        m3 = w[2] - 3 * mu * w[1] + 2 * mu**3
        m4 = w[3] - 4 * mu * w[2] + 6 * mu**2 * w[1] - 3 * mu**4
        starts = torch.arange(len(mu), device=self.device)
        valid = (self.block[starts] == self.block[starts + m - 1]) & (m2 > 0)
        safe = m2.clamp_min(1e-300)
        w_skew, w_kurt = m3 / safe**1.5, m4 / safe**2
        bits = significand_bits(t)
        # rounding moves the moments by about its size in units of the spread: a coarse copy
        # (float16 far from zero) may rank behind a few hundred windows, a fine one behind none
        mean, spread = float(t.mean()), float(t.std())
        rel = 2.0**-bits * (float(t.abs().max()) + abs(mean)) / spread
        tol = 8 * rel * (1 + abs(skew) + kurt)
        for sign in (1.0, -1.0):
            dist = (w_skew - sign * skew).abs() + 0.5 * (w_kurt - kurt).abs()
            dist = torch.where(valid, dist, torch.full_like(dist, float("inf")))
            near = int(((dist <= tol) & valid).sum())
            k = min(max(CANDIDATES, min(near, MAX_CANDIDATES)), int(valid.sum()))
            starts = torch.topk(dist, k, largest=False).indices
            for j in starts[_could_match(self.values, starts, t, bits)].tolist():
                hit = matches(self.values[j : j + m], t, bits)
                if hit is not None:
                    self._raise(int(self.block[j]), hit, where, sub=(j, m))

    # ------------------------------------------------------------ inside a larger array
    def _windows(self, t: torch.Tensor, where: str, own: bool) -> None:
        """In-order copies (``a·s + b``, rounded) of ≥ MIN_VALUES values anywhere inside ``t``:
        candidates by the signs of neighbours' differences (``audit_windows``), each fitted on
        its key's span and followed as far as it holds. ``own``: ``t`` is shaped like the
        global vector, whose blocks at their own coordinates were checked already."""
        if self._index is None:
            self._sequences = _Sequences.of(self)
            self._index = WindowIndex(self._sequences.parts)
        seqs = self._sequences
        at, seq, start = self._index.candidates(t, self._own_keys() if own else None)
        if not len(at):
            return
        first = seqs.starts[seq] + start
        span = torch.arange(SPAN + 1, device=self.device)
        x = None  # the payload in host memory, read only to grow a fit that holds
        for lo in range(0, len(at), 1 << 14):  # candidates fitted in chunks, many at a time
            rows_t = t[at[lo : lo + (1 << 14), None] + span]
            rows_s = seqs.values[first[lo : lo + (1 << 14), None] + span]
            u = 2.0 ** -_row_bits(rows_t)
            ok, slope, shift_b = _pairs_fit(rows_s, rows_t, u)
            for r in torch.nonzero(ok).flatten().tolist():
                i = lo + r
                ab = (float(slope[r]), float(shift_b[r]))
                q = int(seq[i])
                values = self._index.values[q]
                x = t.cpu().numpy() if x is None else x
                shift, length = extent(x, values, int(at[i]), int(start[i]), *ab, float(u[r]))
                if length >= MIN_VALUES:
                    b, transposed = seqs.block[q], q >= len(self.names)
                    order = "transposed" if transposed else "in order"
                    hit = Match(*ab, order, float(rows_t[r].std()))
                    sub = (int(self.starts[b]) + int(start[i]) + shift, length)
                    self._raise(b, hit, where, sub=sub, at=int(at[i]) + shift)

    def _reordered_inside(self, t: torch.Tensor, where: str) -> None:
        """Exact private values, ≥ MIN_VALUES of them in a row in any order, anywhere inside
        ``t`` (``audit_values``): named as the block most of them come from, and as a sub-block
        where they are exactly one."""
        if self._value_index is None:
            self._value_index = ValueIndex(self.values)
        run = self._value_index.first_run(t, MIN_VALUES)
        if run is None:
            return
        at, copied = run
        m = len(copied)
        words = float32_words(self.values)
        held = torch.nonzero(torch.isin(words, copied)).flatten()
        i = int(torch.mode(self.block[held]).values)
        hit = Match(1.0, 0.0, "reordered", float(t[at : at + m].double().std()))
        lo = self._sub_block(words, held, copied, i)
        if lo is not None:
            self._raise(i, hit, where, sub=(lo, m), at=at)
        raise LeakError(
            f"stopped: {where} carries the server-private {self.names[i]} ({m} of its "
            f"values){hit.describe()} at positions {at}–{at + m - 1}"
        )

    def _sub_block(
        self, words: torch.Tensor, held: torch.Tensor, copied: torch.Tensor, i: int
    ) -> int | None:
        """Where ``copied`` (float32 patterns) is block ``i``'s values from some index on, in
        another order: that index into the concatenated blocks, or None. The values that sit
        only once among the blocks bound it (a value that repeats may also sit elsewhere)."""
        _, inverse, counts = torch.unique(words[held], return_inverse=True, return_counts=True)
        once = held[counts[inverse] == 1]
        if not len(once):
            return None
        m, ordered = len(copied), torch.sort(copied).values
        for lo in (int(once.min()), int(once.max()) - m + 1):
            inside = int(self.starts[i]) <= lo <= int(self.ends[i]) - m
            if inside and torch.equal(torch.sort(words[lo : lo + m]).values, ordered):
                return lo
        return None

    def _own_keys(self) -> torch.Tensor:
        """``sign_keys`` of the blocks laid out at their own coordinates (zeros elsewhere)."""
        if self._own is None:
            layout = torch.zeros(self.size, dtype=torch.float32, device=self.device)
            layout[self.indices] = self.values.float()
            self._own = sign_keys(layout)
        return self._own

    def _power_sums(self) -> list[torch.Tensor]:
        """Prefix sums of the powers 1–4 of each block's values less the block's mean (so the
        sums stay accurate); float64, made once, when first used."""
        if self._sums is None:
            n = len(self.names)
            count = torch.bincount(self.block, minlength=n).to(torch.float64)
            means = torch.zeros(n, dtype=torch.float64, device=self.device)
            means = means.index_add_(0, self.block, self.values.double()) / count.clamp_min(1)
            centred = self.values.double() - means[self.block]
            zero = torch.zeros(1, dtype=torch.float64, device=self.device)
            self._sums = [torch.cat([zero, torch.cumsum(centred**p, 0)]) for p in range(1, 5)]
        return self._sums

    # --------------------------------------------------------------- exact float32 bytes
    def _bytes_hit(self, a: np.ndarray) -> str | None:
        """Name of a block whose float32 bytes occur in ``a``, an array of no float dtype
        (§6.3 (ii)), or None. A float32 array is searched on the device (``ExactCopies``)."""
        if not self.words:
            return None
        raw = np.ascontiguousarray(a).tobytes()  # a plain byte search
        for name, words in zip(self.names, self.words, strict=True):
            if words.tobytes() in raw:
                return name
        return None

    def _raise(
        self,
        i: int,
        m: Match,
        where: str,
        sub: tuple[int, int] | None = None,
        at: int | None = None,
    ) -> None:
        """``LeakError`` naming the block (and which of its values, ``sub``: (index into the
        concatenated blocks, count)), the map, and where in the array the copy sits (``at``)."""
        what = self.names[i]
        if sub is not None and sub[1] < self.ends[i] - self.starts[i]:
            lo = sub[0] - int(self.starts[i])
            of = " of its transpose" if m.order == "transposed" else ""
            what += f" (values {lo}–{lo + sub[1] - 1}{of})"
        place = f" at positions {at}–{at + sub[1] - 1}" if at is not None and sub else ""
        raise LeakError(f"stopped: {where} carries the server-private {what}{m.describe()}{place}")


@dataclass(frozen=True)
class _Sequences:
    """What the in-order search (``_windows``) indexes: each block's values, then each 2-D
    block's transpose (``LeakAuditor.shapes_2d``), one after another in ``values``, starting at
    ``starts``; ``block``: the block each sequence is."""

    parts: list[torch.Tensor]
    values: torch.Tensor
    starts: torch.Tensor
    block: list[int]

    @classmethod
    def of(cls, auditor: LeakAuditor) -> _Sequences:
        spans = zip(auditor.starts.tolist(), auditor.ends.tolist(), strict=True)
        parts = [auditor.values[lo:hi] for lo, hi in spans]
        block = list(range(len(parts)))
        for i, rows, cols in auditor.shapes_2d:
            parts.append(parts[i].reshape(rows, cols).T.contiguous().reshape(-1))
            block.append(i)
        values = torch.cat(parts) if len(parts) > len(auditor.names) else auditor.values
        sizes = torch.tensor([len(p) for p in parts], dtype=torch.int64, device=auditor.device)
        return cls(parts, values, torch.cumsum(sizes, 0) - sizes, block)


def _matrix(shape: tuple[int, ...] | None, size: int) -> bool:
    """Whether ``shape`` is a matrix of ``size`` values whose transpose is another order."""
    return shape is not None and len(shape) == 2 and min(shape) > 1 and shape[0] * shape[1] == size


def _stats(x: torch.Tensor) -> torch.Tensor:
    """``Summary``'s fields of ``x`` as one float64 tensor on its device: mean, std, min, max."""
    mean, low, high = _mean_and_extremes(x)
    near = mean.to(x.dtype)  # x − near is exact to x's rounding; mean − near corrects it
    var = _sum64((x - near).square_()) / len(x) - (mean - near.double()) ** 2
    return torch.stack([mean, var.clamp_min(0).sqrt(), low, high])


def _mean_and_extremes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x``'s mean, min and max as float64 tensors on its device (one pass each)."""
    low, high = torch.aminmax(x)
    return _sum64(x) / len(x), low.double(), high.double()


def _extremes_maps(
    s_low: float, s_high: float, low: float, high: float
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The two maps ``(a, b)`` that take ``[s_low, s_high]`` onto ``[low, high]``: ``a > 0``
    and ``a < 0``."""
    a = (high - low) / (s_high - s_low)
    return (a, low - a * s_low), (-a, high + a * s_low)


def _sum64(x: torch.Tensor) -> torch.Tensor:
    """The float64 sum of ``x``: sums of ``SUM_CHUNK`` values in ``x``'s dtype, added in float64
    (about 1e-10 of the sum, at the cost of one pass; torch's float64 sum of float32 values
    takes 30 times as long on the CPU)."""
    flat = x.reshape(-1)
    k = len(flat) // SUM_CHUNK * SUM_CHUNK
    return flat[:k].view(-1, SUM_CHUNK).sum(1).double().sum() + flat[k:].double().sum()


def _pairs_fit(
    s: torch.Tensor, t: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fit`` for each row pair of ``s`` and ``t`` at its row's unit roundoff ``u``: which
    rows of ``t`` could be ``a·s + b`` of their row of ``s``, and each row's ``a`` and ``b``."""
    s, t = s.double(), t.double()
    sc = s - s.mean(1, keepdim=True)
    tc = t - t.mean(1, keepdim=True)
    ss, tt = sc.square().sum(1), tc.square().sum(1)
    a = (sc * tc).sum(1) / ss.clamp_min(1e-300)
    b = t.mean(1) - a * s.mean(1)
    r = t - (a[:, None] * s + b[:, None])
    u = u[:, None]
    bound = 2 * u * (t.abs() + b.abs()[:, None]) + u * (tt[:, None] / t.shape[1]).sqrt()
    explained = r.square().sum(1) <= EXPLAINED**2 * tt
    return (ss > 0) & (tt > 0) & explained & (r.abs() <= bound).all(1), a, b


def _rows_fit(rows: torch.Tensor, t: torch.Tensor, u: float) -> torch.Tensor:
    """Which rows of ``rows`` ``t`` could be ``a·s + b`` of (``_pairs_fit`` against one ``t``)."""
    full = torch.full((rows.shape[0],), u, dtype=torch.float64, device=rows.device)
    return _pairs_fit(rows, t.expand_as(rows), full)[0]


def _row_bits(rows: torch.Tensor) -> torch.Tensor:
    """``significand_bits`` of each row's values: 8, 11, 24 or 53."""
    mant = torch.frexp(rows.double()).mantissa
    bits = torch.full((rows.shape[0],), 53.0, dtype=torch.float64, device=rows.device)
    for b in reversed(PRECISIONS[:-1]):
        fits = ((mant * 2.0**b) % 1 == 0).all(1)
        bits = torch.where(fits, torch.full_like(bits, float(b)), bits)
    return bits


def _could_match(values: torch.Tensor, starts: torch.Tensor, t: torch.Tensor, bits: int):
    """Which windows ``values[j : j + len(t)]`` (``j`` in ``starts``) pass ``matches``' fits,
    checked many at a time (the few that pass are then checked one by one)."""
    m = len(t)
    keep = torch.zeros(len(starts), dtype=torch.bool, device=t.device)
    u = 2.0**-bits
    reorder = Summary.of(t).beats_chance(m, u)
    t_sorted = t.sort().values
    step = max(1, (1 << 22) // m)
    for lo in range(0, len(starts), step):
        rows = values[starts[lo : lo + step, None] + torch.arange(m, device=t.device)]
        ok = _rows_fit(rows, t, u) | _rows_fit(rows.flip(1), t, u)
        if reorder:
            ranked = rows.sort(1).values
            ok |= _rows_fit(ranked, t_sorted, u) | _rows_fit(ranked.flip(1), t_sorted, u)
        keep[lo : lo + step] = ok
    return keep


def _span(indices: np.ndarray) -> tuple[int, int] | None:
    first = int(indices[0])
    if np.array_equal(indices, np.arange(first, first + len(indices))):
        return first, first + len(indices)
    return None


def _is_float(a: np.ndarray | torch.Tensor) -> bool:
    if isinstance(a, torch.Tensor):
        return a.is_floating_point()
    return np.issubdtype(a.dtype, np.floating)


def _as_tensor(flat: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """The values on ``device``: float64 stays float64, every narrower float becomes float32."""
    if not isinstance(flat, torch.Tensor):
        with warnings.catch_warnings():  # a published version is read-only; this only reads it
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(np.ascontiguousarray(flat))
    wide = flat.dtype == torch.float64
    return flat.detach().to(device=device, dtype=torch.float64 if wide else torch.float32)
