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


class LeakAuditor:
    """Checks payloads against ``secrets``; a leak raises ``LeakError`` naming block and payload."""

    def __init__(self, secrets: list[Secret], size: int) -> None:
        self.secrets = [s for s in secrets if s.values.size and np.any(s.values != 0)]
        #: each secret's float32 bytes for the substring check (None: too short to count)
        self.patterns = [_pattern(s.values) for s in self.secrets]
        self.size = size
        self.checked = 0

    def check(self, payload: Any, where: str) -> None:
        for a in _arrays(payload):
            self.checked += 1
            raw = np.ascontiguousarray(a).tobytes()
            for s, pattern in zip(self.secrets, self.patterns, strict=True):
                if a.shape == (self.size,) and np.allclose(
                    a[s.indices], s.values, rtol=1e-6, atol=0
                ):
                    raise LeakError(f"stopped: {where} carries the server-private {s.name}")
                if pattern is not None and pattern in raw:
                    raise LeakError(f"stopped: {where} carries the server-private {s.name}'s bytes")
