"""The worker as a Ray actor: a light shell around a ``ClientRunner`` built on its first call.

This module imports neither torch nor the models, so the coordinator can start its workers before
its own imports and the dataset's build: a worker's start-up (torch, the models, the lazy
``torch._dynamo`` import of ``torch.optim``) runs alongside the coordinator's instead of after it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from raysim.state.store import StoredState
from raysim.tracking import timeline  # standard library only: no torch at import

if TYPE_CHECKING:
    import numpy as np

    from raysim.actors.jobs import ClientJob, EvalJob
    from raysim.actors.worker import ClientRunner


class Worker:
    """Wrapped with ``ray.remote`` by the pool. The constructor only imports; the runner (the
    resident model) is built from the dataset on the first call.

    Neither the dataset nor the config is a constructor argument (Ray cannot guarantee restarts
    for actors whose constructor arguments live in the object store, ray-project/ray#53727): every
    call carries their object refs (``data``: the dataset's, then the config's, nested in a list
    so that Ray does not resolve them), and the worker fetches them (zero-copy) on its first
    call, after a restart included. So a worker can start before its run's config is known (a
    Tune trial's, ``raysim.sweeps.early``).
    """

    def __init__(self, threads: int = 1) -> None:
        from raysim.sweeps import early
        from raysim.util.quiet import quiet_libraries

        early.stand_down()
        quiet_libraries()
        import torch._dynamo  # noqa: F401 - torch.optim imports it on first use (~1.5 s)

        import raysim.actors.worker  # noqa: F401 - the runner, the models, the training loop

        timeline.role("worker")
        self._threads = threads
        self._runner: ClientRunner | None = None

    def _attached(self, data: list[Any]) -> ClientRunner:
        if self._runner is None:
            import ray

            from raysim.actors.worker import RayClientRunner

            dataset, config = ray.get(data[:2])
            self._runner = RayClientRunner(config, dataset, self._threads)
        return self._runner

    def run_batch(
        self, weights: np.ndarray, jobs: list[ClientJob], data: list[Any], hold: bool = False
    ) -> tuple[Any, ...]:
        """The batch's results, then each job's personal state as a return value of its own,
        then, with ``hold`` (``workers.partial_sums``), each job's delta as one of its own.

        Called with ``num_returns = len(jobs) + 1``: each state becomes an object owned by the
        coordinator that the pool hands back as a reference, so the coordinator never copies it
        and the next job's worker reads it straight from the object store. A result's ``state``
        is None where the state went out that way, ``{}`` where the model keeps none; a state
        written to disk (``StoredState``, a few bytes) stays in its result. ``weights``: the
        version (resolved by Ray), or a list of one version ref per job.

        Called with ``hold``, ``num_returns`` is ``2·len(jobs) + 1``: each delta then stays in
        this node's object store (its result says ``LeftOnNode``), where the node's reducer sums
        it (``raysim.actors.reduce``)."""
        if isinstance(weights, list):  # refs inside a list are not resolved by the call
            with timeline.span("fetch versions", jobs[0].dispatch_round):
                weights = _versions(weights)
        with timeline.span("train", jobs[0].dispatch_round):
            results = self._attached(data).run_batch(weights, jobs)
        states = [None if isinstance(r.state, StoredState) else r.state for r in results]
        for r in results:
            if not isinstance(r.state, StoredState):
                r.state = None if r.state else {}
            r.worker_pid = os.getpid()
        if not hold:
            return (results, *states)
        import ray

        from raysim.actors.jobs import LeftOnNode

        node = ray.get_runtime_context().get_node_id()
        deltas = [r.delta for r in results]
        for r in results:
            r.delta, r.node = LeftOnNode(tuple(r.delta.shape), int(r.delta.nbytes)), node
        return (results, *states, *deltas)

    def evaluate_batch(
        self, weights: np.ndarray, jobs: list[EvalJob], data: list[Any]
    ) -> list[dict[str, dict[str, float]]]:
        with timeline.span("evaluate"):
            return self._attached(data).evaluate_batch(weights, jobs)

    def serve(self, request: tuple[Any, ...] | None) -> bytes | None:
        """A request through the worker's compiled graph (``raysim.actors.compiled``): ``(kind,
        weights, jobs, data)`` with kind ``train`` or ``evaluate``, answered as ``run_batch`` or
        ``evaluate_batch`` would be, pickled; None (the link's first request) gets None.

        Arrays that arrive through a compiled graph are views of its channel's shared memory,
        which the coordinator cannot write again while a view is alive, so the request's arrays
        are copied first, and the answer goes back as bytes (the coordinator's copy is its own).
        ``weights`` may arrive as the version's object ref, which a call would have resolved."""
        if request is None:
            return None
        import dataclasses
        import pickle

        import numpy as np
        import ray

        kind, weights, jobs, data = request
        with timeline.span("link: the version", getattr(jobs[0], "dispatch_round", -1)):
            if isinstance(weights, list):
                weights = _versions(weights)
            elif isinstance(weights, ray.ObjectRef):
                weights = ray.get(weights)
            else:
                weights = np.array(weights)
        jobs = [
            dataclasses.replace(j, own={k: np.array(v) for k, v in j.own.items()})
            if getattr(j, "own", None)
            else j
            for j in jobs
        ]
        if kind == "train":
            answer = self.run_batch(weights, jobs, data)
        else:
            answer = self.evaluate_batch(weights, jobs, data)
        return pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def sequential_reason(self, data: list[Any]) -> str:
        return self._attached(data).sequential_reason()

    def initial_global(self, data: list[Any]) -> tuple[Any, Any]:
        return self._attached(data).initial_global()

    def info(self, data: list[Any]) -> dict[str, Any]:
        import ray
        import torch

        runner = self._attached(data)
        ctx = ray.get_runtime_context()
        return {
            "pid": os.getpid(),
            "node_id": ctx.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            **runner.usage(),
            "torch_threads": torch.get_num_threads(),
            "base_params": sum(p.numel() for p in runner.model.module.parameters()),
        }


def _versions(refs: list[Any]) -> list[Any]:
    """One version per job, each distinct ref fetched once (values pass as copies)."""
    import numpy as np
    import ray

    unique = list(dict.fromkeys(r for r in refs if isinstance(r, ray.ObjectRef)))
    got = dict(zip(unique, ray.get(unique), strict=True))
    return [got[r] if isinstance(r, ray.ObjectRef) else np.array(r) for r in refs]
