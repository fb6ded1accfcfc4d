"""``CoordinatorCore``'s model versions: the global models and downlinks that jobs read.

Every change of the global model is a new version (``version``, counted from 0). A version is
published (an immutable float32 copy, put once where the workers read it) when a dispatch or a
worker-side evaluation first needs it, and kept while jobs dispatched on it are in flight
(``refs``): an update's staleness in versions is the current version minus the one it was
dispatched on. A round's downlink (``Strategy.configure``) is published once and kept alike, by
dispatch round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from raysim.actors.executor import Executor
from raysim.algorithms.base import Downlink, Strategy


@dataclass
class _Version:
    weights: np.ndarray
    handle: Any
    refs: int = 0


@dataclass
class _Broadcast:
    """One round's downlink, published once, kept while jobs dispatched with it are in flight."""

    downlink: Downlink
    handle: Any
    refs: int = 0


class ModelVersions:
    """The part of ``CoordinatorCore`` that holds ``version``, the published versions
    (``_versions``, by number) and downlinks (``_broadcasts``, by dispatch round)."""

    # the core's, used here
    executor: Executor
    strategy: Strategy
    _audit: Callable[[Any, str], None]  # the leak auditor's check of what is published

    def _init_versions(self) -> None:
        self.version = 0
        self._versions: dict[int, _Version] = {}
        self._broadcasts: dict[int, _Broadcast] = {}  # by dispatch round

    def _current_handle(self) -> _Version:
        v = self._versions.get(self.version)
        if v is None:
            v = self._versions[self.version] = self._publish(self.strategy.weights)
        return v

    def _publish(self, weights: np.ndarray, refs: int = 0) -> _Version:
        """An immutable float32 copy of ``weights``, put once where the workers read it."""
        w = np.array(weights, dtype=np.float32, copy=True)
        w.flags.writeable = False  # a version is immutable once published
        self._audit(w, f"the global model of version {self.version}")
        return _Version(w, self.executor.put(w), refs)

    def _publish_downlink(self, k: int, downlink: Downlink, refs: int) -> None:
        """Round ``k``'s downlink, audited and put once, for the ``refs`` jobs it goes with."""
        payload = [dict(downlink.tensors), dict(downlink.per_client)]
        self._audit(payload, f"round {k}'s downlink")
        b = _Broadcast(downlink, self.executor.put(dict(downlink.tensors)), refs)
        self._broadcasts[k] = b

    def _release_broadcast(self, dispatch_round: int) -> None:
        b = self._broadcasts.get(dispatch_round)
        if b is not None:
            b.refs -= 1
            if b.refs <= 0:
                del self._broadcasts[dispatch_round]

    def _release(self, version: int) -> None:
        v = self._versions[version]
        v.refs -= 1
        if v.refs == 0 and version != self.version:
            del self._versions[version]

    def _bump(self, changed: bool) -> None:
        if changed:
            old = self.version
            self.version += 1
            if old in self._versions and self._versions[old].refs == 0:
                del self._versions[old]
