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

A node's deltas are cut into as many contiguous slices as the node has CPUs (at most
``MAX_REDUCERS``, at least ``MIN_SLICE`` deltas a slice), each summed by a reducer of its own on
that node at the same time; the first reducer then adds the others' partials, read from the
node's store, so one partial still leaves the node. Reducers are started on a node the first
time a sum needs them (no CPU reserved: they add numbers while the workers wait for the round's
end), restarted by Ray if they die. A delta stays in
its node's store while an ``Update`` refers to it, and survives its worker's death (the store is
the node's); it is fetched whole only where a strategy's state is written to a checkpoint.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysim.algorithms.exact_sum import HeldDelta, Partial, exact_sum

#: the most reducers on one node (a slice each), and the fewest deltas a slice is worth
MAX_REDUCERS = 8
MIN_SLICE = 4

#: a partial as it travels: (int64 total, bound, terms, seconds it took)
Sent = tuple[Any, int, int, float]


class Reducer:
    """Sums deltas of one node (made a Ray actor by ``NodeSums``)."""

    def partial(self, weights: list[float], *deltas: np.ndarray) -> Sent:
        """``Σ weights[j]·deltas[j]`` in fixed point."""
        t0 = time.perf_counter()
        p = exact_sum(deltas, weights)
        return p.total, p.bound, p.terms, time.perf_counter() - t0

    def merge(self, *parts: Sent) -> Sent:
        """The sum of partials from this node's other reducers (their longest time, plus this
        one's): one partial leaves the node."""
        t0 = time.perf_counter()
        out = Partial()
        for total, bound, terms, _ in parts:
            out.merge(Partial(total, bound, terms))
        slowest = max(seconds for *_, seconds in parts)
        return out.total, out.bound, out.terms, slowest + time.perf_counter() - t0


@functools.cache
def _reducer_class() -> Any:
    """``Reducer`` as a Ray actor class, made once per process (each ``ray.remote`` exports the
    class anew, as the pool's ``_worker_class`` notes)."""
    return ray.remote(Reducer)


class NodeSums:
    """The ``SumSource`` of a Ray pool's held deltas: one reducer per node, started on demand.

    ``bytes_in`` counts what reached the coordinator's process through it (partials, fetched
    deltas); ``reduce_s`` the reducers' own seconds (they run in parallel, one per node)."""

    def __init__(self) -> None:
        self._reducers: dict[str, list[Any]] = {}
        self._cpus: dict[str, float] | None = None
        self.bytes_in = 0
        self.reduce_s: dict[str, float] = {}

    def hold(self, ref: Any, shape: tuple[int, ...], nbytes: int, node: str) -> HeldDelta:
        """A delta the pool left on ``node`` (its object ref)."""
        return HeldDelta(self, ref, shape, nbytes, node)

    def _slices(self, node: str, n: int) -> int:
        """How many reducers sum ``n`` deltas on ``node``: its CPUs, within the bounds above."""
        if self._cpus is None or node not in self._cpus:  # a node that joined since: read again
            self._cpus = {x["NodeID"]: x["Resources"].get("CPU", 1) for x in ray.nodes()}
        cpus = int(self._cpus.get(node, 1))
        return max(1, min(MAX_REDUCERS, cpus, n // MIN_SLICE))

    def _reducer(self, node: str, i: int) -> Any:
        reducers = self._reducers.setdefault(node, [])
        while len(reducers) <= i:
            where = NodeAffinitySchedulingStrategy(node, soft=False) if node else "DEFAULT"
            options = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": -1}
            reducers.append(_reducer_class().options(**options, scheduling_strategy=where).remote())
        return reducers[i]

    def _node_sum(self, node: str, held: list[tuple[HeldDelta, float]]) -> Any:
        """One node's partial (a ref): its slices summed side by side, then merged there."""
        k = self._slices(node, len(held))
        bounds = np.linspace(0, len(held), k + 1).round().astype(int)
        parts = [
            self._reducer(node, i).partial.remote(
                [w for _, w in held[a:b]], *(d.key for d, _ in held[a:b])
            )
            for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        ]
        return parts[0] if k == 1 else self._reducer(node, 0).merge.remote(*parts)

    def partial(self, items: Sequence[tuple[HeldDelta, float]]) -> Partial:
        by_node: dict[str, list[tuple[HeldDelta, float]]] = {}
        for delta, weight in items:
            by_node.setdefault(delta.node, []).append((delta, weight))
        calls = {node: self._node_sum(node, held) for node, held in sorted(by_node.items())}
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
        for reducers in self._reducers.values():
            for reducer in reducers:
                ray.kill(reducer)
        self._reducers = {}
