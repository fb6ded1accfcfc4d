"""The leak auditor: every payload the coordinator sends to clients is checked against the
strategy's server-private values (``Strategy.secrets``), as fedbaf.md §6.3 asks, knowing no paper.

A payload leaks a secret block when its values at the block's coordinates equal the secret's
(``allclose``, rtol 1e-6), or when the block's bytes occur anywhere in the payload's bytes. A
reachable reference cannot happen: private tensors refuse to be pickled (``PrivateTensors``), so
a payload holding one fails to serialise before it leaves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from raysim.algorithms.base import Secret

MIN_BYTES = 64 * 4  # fedbaf.md §6.3: tensors of 64 float32 values or more


class LeakError(RuntimeError):
    """A payload to clients carries server-private values."""


def _arrays(payload: Any) -> Iterable[np.ndarray]:
    if isinstance(payload, np.ndarray):
        yield payload
    elif isinstance(payload, Mapping):
        for v in payload.values():
            yield from _arrays(v)
    elif isinstance(payload, (list, tuple)):
        for v in payload:
            yield from _arrays(v)


def _pattern(values: np.ndarray) -> bytes | None:
    raw = np.ascontiguousarray(values, dtype=np.float32).tobytes()
    return raw if len(raw) >= MIN_BYTES else None


def _anchor(values: np.ndarray) -> int:
    """A block's first two float32 values as one 64-bit word: where the block could start."""
    return int(np.ascontiguousarray(values[:2], dtype=np.float32).view(np.uint64)[0])


def _float32_holds(flat: np.ndarray, blocks: list[tuple[int, np.ndarray]]) -> int | None:
    """Index (into ``blocks``) of a block whose float32 values sit contiguously in ``flat``.

    Copies in a float32 array start on a 4-byte boundary, so the search looks up every pair of
    neighbouring values (both parities) among the blocks' anchors at once (one vectorised
    ``searchsorted``), then compares the few candidates in full: O(n log k), where searching
    each block's bytes in turn costs O(n·k)."""
    anchors = np.array([a for a, _ in blocks], dtype=np.uint64)
    order = np.argsort(anchors)
    sorted_anchors = anchors[order]
    words = flat.view(np.uint32)
    for parity in (0, 1):
        body = words[parity:]
        body = body[: len(body) - len(body) % 2]
        pairs = body.view(np.uint64)
        slot = np.minimum(np.searchsorted(sorted_anchors, pairs), len(anchors) - 1)
        for i in np.flatnonzero(sorted_anchors[slot] == pairs):
            start = parity + 2 * int(i)
            for k in np.flatnonzero(anchors == pairs[i]):
                pattern = blocks[k][1]
                if np.array_equal(words[start : start + len(pattern)], pattern):
                    return int(k)
    return None


class LeakAuditor:
    """Checks payloads against ``secrets``; a leak raises ``LeakError`` naming block and payload."""

    def __init__(self, secrets: list[Secret], size: int) -> None:
        self.secrets = [s for s in secrets if s.values.size and np.any(s.values != 0)]
        #: each secret's float32 bytes for the substring check (None: too short to count)
        self.patterns = [_pattern(s.values) for s in self.secrets]
        #: (anchor, float32 words) of the secrets long enough to count, for float32 payloads
        self.blocks = [
            (i, _anchor(s.values), np.ascontiguousarray(s.values, dtype=np.float32).view(np.uint32))
            for i, (s, p) in enumerate(zip(self.secrets, self.patterns, strict=True))
            if p is not None
        ]
        self.size = size
        self.checked = 0

    def check(self, payload: Any, where: str) -> None:
        for a in _arrays(payload):
            self.checked += 1
            for s in self.secrets:
                if a.shape == (self.size,) and np.allclose(
                    a[s.indices], s.values, rtol=1e-6, atol=0
                ):
                    raise LeakError(f"stopped: {where} carries the server-private {s.name}")
            hit = self._bytes_hit(a)
            if hit is not None:
                name = self.secrets[hit].name
                raise LeakError(f"stopped: {where} carries the server-private {name}'s bytes")

    def _bytes_hit(self, a: np.ndarray) -> int | None:
        """Index of a secret whose float32 bytes occur in ``a`` (§6.3 (ii)), or None."""
        if not self.blocks:
            return None
        if a.dtype == np.float32 and a.size >= 2:
            flat = np.ascontiguousarray(a).reshape(-1)
            k = _float32_holds(flat, [(anchor, words) for _, anchor, words in self.blocks])
            return None if k is None else self.blocks[k][0]
        raw = np.ascontiguousarray(a).tobytes()  # any other dtype: a plain byte search
        for i, _, words in self.blocks:
            if words.tobytes() in raw:
                return i
        return None
