"""Partial sums where the updates are (``workers.partial_sums``): one reducer per node.

A worker returns each client's delta as an object of its own, which Ray keeps in the object
store of the worker's node; the coordinator holds only its reference (a ``HeldDelta``). When a
strategy sums its updates (``WeightedMean.combine``), ``NodeSums`` asks one ``Reducer`` actor on
each node that holds some of them for their weighted sum, in fixed point
(``raysim.algorithms.exact_sum``): it reads them from its node's store without a copy over the
network, and only its partial sum (int64, 8 bytes a parameter) goes to the coordinator, which adds
the nodes' partials. So the coordinator's ingress per sum is one partial per node, not one
update per client, and the nodes sum in parallel. Integer sums are exact, so the result is the
same bits however the updates are spread over workers and nodes.

A reducer is started on a node the first time a sum needs it (no CPU reserved: it only adds
numbers while the workers wait for the round's end), restarted by Ray if it dies. A delta stays in
its node's store while an ``Update`` refers to it, and survives its worker's death (the store is
the node's); it is fetched whole only where a strategy's state is written to a checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysim.algorithms.exact_sum import HeldDelta, Partial, exact_sum


class Reducer:
    """Sums the deltas of one node (made a Ray actor by ``NodeSums``)."""

    def partial(self, weights: list[float], *deltas: np.ndarray) -> tuple[Any, int, int, float]:
        """``Σ weights[j]·deltas[j]`` in fixed point: (int64 total, bound, terms, seconds)."""
        t0 = time.perf_counter()
        p = exact_sum(deltas, weights)
        return p.total, p.bound, p.terms, time.perf_counter() - t0


class NodeSums:
    """The ``SumSource`` of a Ray pool's held deltas: one reducer per node, started on demand.

    ``bytes_in`` counts what reached the coordinator's process through it (partials, fetched
    deltas); ``reduce_s`` the reducers' own seconds (they run in parallel, one per node)."""

    def __init__(self) -> None:
        self._reducers: dict[str, Any] = {}
        self.bytes_in = 0
        self.reduce_s: dict[str, float] = {}

    def hold(self, ref: Any, shape: tuple[int, ...], nbytes: int, node: str) -> HeldDelta:
        """A delta the pool left on ``node`` (its object ref)."""
        return HeldDelta(self, ref, shape, nbytes, node)

    def _reducer(self, node: str) -> Any:
        reducer = self._reducers.get(node)
        if reducer is None:
            where = NodeAffinitySchedulingStrategy(node, soft=False) if node else "DEFAULT"
            reducer = (
                ray.remote(Reducer)
                .options(
                    num_cpus=0,
                    max_restarts=-1,
                    max_task_retries=-1,
                    scheduling_strategy=where,
                )
                .remote()
            )
            self._reducers[node] = reducer
        return reducer

    def partial(self, items: Sequence[tuple[HeldDelta, float]]) -> Partial:
        by_node: dict[str, list[tuple[HeldDelta, float]]] = {}
        for delta, weight in items:
            by_node.setdefault(delta.node, []).append((delta, weight))
        calls = {
            node: self._reducer(node).partial.remote(
                [w for _, w in held], *(d.key for d, _ in held)
            )
            for node, held in sorted(by_node.items())
        }
        out = Partial()
        for node, (total, bound, terms, seconds) in zip(
            calls, ray.get(list(calls.values())), strict=True
        ):
            out.merge(Partial(total, bound, terms))
            self.bytes_in += total.nbytes
            self.reduce_s[node] = self.reduce_s.get(node, 0.0) + seconds
        return out

    def fetch(self, delta: HeldDelta) -> np.ndarray:
        value = np.array(ray.get(delta.key))
        self.bytes_in += value.nbytes
        return value

    def take_counts(self) -> tuple[int, dict[str, float]]:
        """Bytes in and reducer seconds per node since the last call."""
        out = self.bytes_in, self.reduce_s
        self.bytes_in, self.reduce_s = 0, {}
        return out

    def close(self) -> None:
        for reducer in self._reducers.values():
            ray.kill(reducer)
        self._reducers = {}
