"""A pool of Ray worker actors sized from the cluster; jobs go out in batches."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from raysim.actors.jobs import ClientJob, ClientResult, EvalJob, job_groups
from raysim.actors.worker_actor import Worker

if TYPE_CHECKING:
    from raysim.config import RunConfig


@dataclass(frozen=True)
class WorkerLaunch:
    """What starting a run's workers takes, as plain values: the config as sent, Ray's actor
    options, the torch threads each, and how many to start at once (``busy_workers``). Made by
    the driver (``for_config``), so that the coordinator starts its workers before its own
    imports: their start-up runs alongside the coordinator's and the dataset's build."""

    config: dict[str, Any]
    options: dict[str, Any]
    threads: int
    count: int

    @classmethod
    def for_config(cls, cfg: RunConfig, pool_size: int) -> WorkerLaunch:
        w = cfg.workers
        return cls(
            config=cfg.to_dict(),
            options={
                "num_cpus": w.num_cpus,
                "num_gpus": w.num_gpus,
                "max_restarts": w.max_restarts,
                "max_task_retries": -1,
            },
            threads=w.threads,
            count=busy_workers(cfg, pool_size, cfg.group_size()),
        )

    def start(self) -> Any:
        """One worker actor, starting now."""
        return _worker_class().options(**self.options).remote(self.config, self.threads)


@functools.cache
def _worker_class() -> Any:
    """``Worker`` as a Ray actor class, made once per process: each ``ray.remote`` exports the
    class anew (12 ms a worker on 2 vCPUs, against 0.3 ms reused)."""
    return ray.remote(Worker)


class RayWorkerPool:
    """Owns the worker actors. A dead actor is restarted by Ray and its batch re-run.

    Each global version is ``ray.put`` once as numpy (zero-copy reads on every worker of a node).
    A round's jobs are split into one contiguous batch per worker (one call per worker per round);
    in ``per_client`` mode every client has its own actor and a batch is that client's job; jobs
    that train together (``workers.execution: batched``, or a method whose round trains together)
    go out as one batch per group, cut by the schedule.

    A pool sized ``auto`` starts only the workers a round keeps busy (``busy_workers``); the
    others of its reservation start when work needs them (a model that cannot batch, an
    evaluation with more jobs than workers), so an idle worker costs no start-up.
    """

    def __init__(
        self,
        cfg: RunConfig,
        dataset_ref: Any,
        size: int,
        client_sizes: np.ndarray | None = None,
        launch: WorkerLaunch | None = None,
        started: list[Any] | None = None,
    ) -> None:
        """``started``: workers already started from ``launch`` (``WorkerLaunch.start``)."""
        w = cfg.workers
        self.per_client = w.count == "per_client"
        #: jobs that train together (batched execution, or a method whose round trains
        #: together) go out as one batch per group (``job_groups``)
        self.group_size = cfg.group_size()
        self._launch = launch or WorkerLaunch.for_config(cfg, size)
        self.data = [dataset_ref]  # sent with every call; see ``Worker``
        self._size = size
        self.workers: list[Any] = list(started or [])
        self._grow(self._launch.count)
        if self.group_size > 1 and w.execution == "auto":  # the built model may not batch
            if ray.get(self.workers[0].sequential_reason.remote(self.data)):
                self.group_size = 1
                self._grow(size)
        self._where: dict[int, tuple[Any, int]] = {}
        self._fetched: dict[Any, list[ClientResult]] = {}
        self._remaining: dict[Any, int] = {}
        self._sizes = client_sizes
        self._pids: dict[int, set[int]] = {}
        self._events: list[str] = []

    def _grow(self, n: int) -> None:
        """Start workers until ``n`` run (at most the pool's reserved size)."""
        while len(self.workers) < min(n, self._size):
            self.workers.append(self._launch.start())

    def put(self, weights: np.ndarray) -> Any:
        return ray.put(weights)

    def get(self, handle: Any) -> Any:
        return ray.get(handle) if isinstance(handle, ray.ObjectRef) else handle

    def _batches(self, jobs: list[ClientJob]) -> list[tuple[int, list[ClientJob]]]:
        """Per-client actors get their own job; a pool gets one batch per worker, balanced by
        client data size (longest first to the least-loaded worker; deterministic)."""
        if self.per_client:
            return [(job.client, [job]) for job in jobs]
        if self.group_size > 1:
            return self._grouped(jobs)
        n = min(len(self.workers), len(jobs))
        batches: list[list[ClientJob]] = [[] for _ in range(n)]
        for i, w in self._least_loaded([self._cost([j]) for j in jobs], n):
            batches[w].append(jobs[i])
        return [(w, b) for w, b in enumerate(batches) if b]

    def _grouped(self, jobs: list[ClientJob]) -> list[tuple[int, list[ClientJob]]]:
        """One batch per group; groups go to the least-loaded worker, the largest first."""
        groups = job_groups(jobs, self.group_size)
        placed = self._least_loaded([self._cost(g) for g in groups], len(self.workers))
        return [(w, groups[i]) for i, w in placed]

    def _cost(self, jobs: list[ClientJob]) -> int:
        return sum(1 if self._sizes is None else int(self._sizes[j.client]) for j in jobs)

    @staticmethod
    def _least_loaded(cost: list[int], n: int) -> list[tuple[int, int]]:
        """(item, worker) pairs: the costliest item first, each to the least-loaded of ``n``
        workers (ties to the lower index; deterministic)."""
        load, out = [0] * n, []
        for i in sorted(range(len(cost)), key=lambda i: (-cost[i], i)):
            w = min(range(n), key=lambda w: (load[w], w))
            load[w] += cost[i]
            out.append((i, w))
        return out

    def submit(self, handle: Any, jobs: list[ClientJob]) -> None:
        for worker, batch in self._batches(jobs):
            call = self.workers[worker].run_batch.options(num_returns=len(batch) + 1)
            ref, *states = call.remote(handle, batch, self.data)
            self._remaining[ref] = len(batch)
            for i, job in enumerate(batch):
                self._where[job.job_id] = (ref, i, states[i], worker)

    def result(self, job_id: int) -> ClientResult:
        """A job's result; its personal state stays in the object store, by reference."""
        ref, i, state, worker = self._where.pop(job_id)
        if ref not in self._fetched:
            self._fetched[ref] = ray.get(ref)
        out = self._fetched[ref][i]
        self._note_pid(worker, out.worker_pid)
        if out.state is None:
            out.state = state
        self._remaining[ref] -= 1
        if self._remaining[ref] == 0:
            del self._remaining[ref], self._fetched[ref]
        return out

    def _note_pid(self, worker: int, pid: int, why: str = "its jobs ran again") -> None:
        """A process not seen before for this worker is a restart. (Results of jobs the old
        process finished may still arrive after the new one's: they are no second restart.)"""
        seen = self._pids.setdefault(worker, set())
        if pid and seen and pid not in seen:
            self._events.append(f"worker {worker} restarted (now process {pid}); {why}")
        if pid:
            seen.add(pid)

    def events(self) -> list[str]:
        """What happened to the workers since the last call (restarts), oldest first."""
        out, self._events = self._events, []
        return out

    def evaluate(self, handle: Any, jobs: list[EvalJob]) -> Callable[[], list[dict[str, float]]]:
        """Evaluation jobs spread evenly over the workers (contiguous chunks, one call each),
        started now; the returned call waits for their results."""
        self._grow(len(jobs))
        n = min(len(self.workers), len(jobs))
        bounds = np.linspace(0, len(jobs), n + 1).round().astype(int)
        refs = [
            self.workers[w].evaluate_batch.remote(
                handle, jobs[bounds[w] : bounds[w + 1]], self.data
            )
            for w in range(n)
        ]
        return lambda: [r for chunk in ray.get(refs) for r in chunk]

    def initial_global(self) -> tuple[np.ndarray, Any]:
        return ray.get(self.workers[0].initial_global.remote(self.data))

    def kill_worker(self, index: int) -> None:
        """Fault injection: kill a worker while its batch runs, and wait until its restarted
        process answers. Ray's kill lands when it lands: during the batch (the batch runs again
        on the new process) or after it, when only a later call would have met the new process,
        perhaps on a coordinator that no longer knew the old one. Either way the restart is
        seen here, in the round the fault names."""
        worker = index % len(self.workers)
        handle = self.workers[worker]
        ray.kill(handle, no_restart=False)
        old = self._pids.get(worker, set())
        deadline = time.monotonic() + 120
        while old and time.monotonic() < deadline:
            pid = ray.get(handle.info.remote(self.data))["pid"]
            if pid not in old:
                self._note_pid(worker, pid, "killed by faults.kill_worker")
                return
            time.sleep(0.02)

    def describe(self) -> list[dict[str, Any]]:
        infos = ray.get([w.info.remote(self.data) for w in self.workers])
        return [{"worker": i, **info} for i, info in enumerate(infos)]

    def close(self) -> None:
        for w in self.workers:
            ray.kill(w)
        self.workers = []


def busy_workers(cfg: RunConfig, size: int, group: int) -> int:
    """Workers a round keeps busy, of a pool of ``size``: with ``workers.count: auto``, groups of
    ``group`` jobs and no delays (each round's jobs finish before the next round's start), a
    round is ``ceil(per_round / group)`` groups; otherwise the whole pool."""
    if cfg.workers.count != "auto" or group == 1 or cfg.delays.kind != "none":
        return size
    return max(1, min(size, math.ceil(cfg.clients.per_round / group)))
