"""A pool of Ray worker actors sized from the cluster; jobs go out in batches."""

from __future__ import annotations

import functools
import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from raysim.actors.compiled import MAX_IN_FLIGHT, WorkerLink, in_actor
from raysim.actors.jobs import (
    ClientJob,
    ClientResult,
    EvalJob,
    LeftOnNode,
    group_count,
    job_groups,
    one_or_each,
)
from raysim.actors.reduce import NodeSums
from raysim.actors.worker_actor import Worker

if TYPE_CHECKING:
    from raysim.config import RunConfig


#: ``workers.transport: auto`` links the workers of models whose global vector is at most this
#: large: a round of a small model is short, so an actor call's fixed cost (~3 ms) is a visible
#: share of it, and a channel's buffers (each as large as the largest message it carried) stay
#: small. A larger model's workers take plain calls, and under ``workers.partial_sums: auto``
#: leave their deltas on their nodes: below it a held delta's own costs (an object and a
#: reference each, ~150 µs more a client on 2 vCPUs) outweigh what it saves
#: (``benchmarks/scale_out.py``).
LINK_MAX_BYTES = 1 << 20

#: a coordinator outside an actor (a driver) builds its links once it has sent batches for this
#: long: there each compiled graph starts a process of its own (Ray's driver proxy actor, about
#: 1 s of CPU on 2 vCPUs), which a short run would not win back at ~3 ms a round. In an actor
#: (the coordinator's, a Tune trial's) a graph starts none (``compiled._proxy_is_this_actor``),
#: and the links are built at the first batch.
LINK_AFTER_S = 2.0


@dataclass(frozen=True)
class WorkerLaunch:
    """What starting a run's workers takes, as plain values: Ray's actor options, the torch
    threads each, and how many to start at once (``busy_workers``). Made by the driver
    (``for_config``), which starts the first coordinator's workers beside it (``RunSession``); a
    coordinator that replaces one starts its own before its imports. Either way their start-up
    runs alongside the coordinator's and the dataset's build. The config reaches them
    with their first call (``Worker``)."""

    options: dict[str, Any]
    threads: int
    count: int

    @classmethod
    def for_config(cls, cfg: RunConfig, pool_size: int) -> WorkerLaunch:
        w = cfg.workers
        return cls(
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
        return _worker_class().options(**self.options).remote(self.threads)


@functools.cache
def _worker_class() -> Any:
    """``Worker`` as a Ray actor class, made once per process: each ``ray.remote`` exports the
    class anew (12 ms a worker on 2 vCPUs, against 0.3 ms reused)."""
    return ray.remote(Worker)


class RayWorkerPool:
    """Owns the worker actors. A dead actor is restarted by Ray and its batch re-run.

    A batch reaches a worker through its compiled graph once that is up (``workers.transport:
    auto``; ``raysim.actors.compiled``), by a plain actor call otherwise; the worker runs the same
    code either way. Each global version is ``ray.put`` once as numpy (zero-copy reads on every
    worker of a node), or, once every worker is linked, carried inside each request.
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
        #: sent with every call: the dataset's and the config's refs (``Worker``)
        self.data = [dataset_ref, ray.put(cfg.to_dict())]
        self._size = size
        #: compiled graphs to the workers (``raysim.actors.compiled``), by worker index
        self._links: dict[int, WorkerLink] = {}
        #: ``workers.partial_sums: true`` insists on them, and a link carries deltas whole
        self._use_links = (
            w.transport == "auto" and not self.per_client and w.partial_sums is not True
        )
        self._node = ray.get_runtime_context().get_node_id() if self._use_links else ""
        self._linking = False  # links are built (``_start_links``)
        self._first_send: float | None = None
        self._link_after = 0.0 if self._use_links and in_actor() else LINK_AFTER_S
        #: batches sent and not yet read, per worker: through its link, and as plain calls
        self._linked: dict[int, list[_Sent]] = {}
        self._called: dict[int, list[_Sent]] = {}
        #: batches sent through a link and by a plain call (a batch sent again counts again)
        self.sent = {"link": 0, "call": 0}
        self.workers: list[Any] = []
        #: workers started before this pool, by its caller (the driver, beside the coordinator
        #: actor; a Tune trial's, as its process loaded: ``raysim.sweeps.early``); the first ones
        self.early = len(started or [])
        for handle in started or []:
            self._add(handle)
        self._grow(self._launch.count)
        if self.group_size > 1 and w.execution == "auto":  # the built model may not batch
            if ray.get(self.workers[0].sequential_reason.remote(self.data)):
                self.group_size = 1
                self._grow(size)
        self._where: dict[int, tuple[_Sent, int]] = {}
        self._remaining: dict[_Sent, int] = {}
        self._sizes = client_sizes
        self._local = cfg.local
        self._pids: dict[int, set[int]] = {}
        self._events: list[str] = []
        #: ``workers.partial_sums``: whether a batch's deltas stay on its worker's node, summed
        #: there: under ``true`` always, under ``auto`` for a model above ``LINK_MAX_BYTES``
        #: (``initial_global``), whose deltas are worth it and whose workers are not linked, so a
        #: run takes one path from its first batch and its byte counts do not depend on when
        #: links came up
        self._may_hold = cfg.partial_sums()
        self._hold = self._may_hold and w.partial_sums is True
        self.sums = NodeSums()

    def _grow(self, n: int) -> None:
        """Start workers until ``n`` run (at most the pool's reserved size)."""
        while len(self.workers) < min(n, self._size):
            self._add(self._launch.start())

    def _add(self, handle: Any) -> None:
        w = len(self.workers)
        self.workers.append(handle)
        self._linked[w], self._called[w] = [], []
        if self._linking:
            self._links[w] = WorkerLink(handle, self._node)

    def _start_links(self) -> None:
        """Build a link to every worker (in the background; when: ``LINK_AFTER_S``)."""
        self._linking = True
        for w, handle in enumerate(self.workers):
            if w not in self._links:
                self._links[w] = WorkerLink(handle, self._node)

    def put(self, weights: Any) -> Any:
        """A handle to ``weights`` for the workers: the object ref of one copy in the object
        store, or, where every worker is reached through its compiled graph, an immutable
        (read-only) array itself, which each request then carries (a ``ray.put`` costs about 1 ms
        on 2 vCPUs, a copy into a request's channel a few µs per 100 KB). A plain call takes
        either."""
        small = isinstance(weights, np.ndarray) and weights.nbytes <= LINK_MAX_BYTES
        if small and not weights.flags.writeable and self._links:
            if len(self._links) == len(self.workers) and all(
                link.ready for link in self._links.values()
            ):
                return weights
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
        """The jobs' local steps (one each where the sizes are not known): what their training
        takes, so that ``max_steps`` or one epoch of unequal data both balance."""
        if self._sizes is None:
            return len(jobs)
        from raysim.training.settings import total_optimizer_steps

        return sum(
            max(1, total_optimizer_steps(int(self._sizes[j.client]), self._local)) for j in jobs
        )

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
        """``handle``: the version every job starts from, or a list of one per job."""
        by_job = (
            {j.job_id: h for j, h in zip(jobs, handle, strict=True)}
            if isinstance(handle, list)
            else None
        )
        for worker, batch in self._batches(jobs):
            sent = self._send(worker, "train", batch_handle(handle, by_job, batch), batch)
            self._remaining[sent] = len(batch)
            for i, job in enumerate(batch):
                self._where[job.job_id] = (sent, i)

    def result(self, job_id: int) -> ClientResult:
        """A job's result; its personal state comes as an object ref, or as a value (``_read``)."""
        sent, i = self._where.pop(job_id)
        out = self._read(sent)[i]
        self._note_pid(sent.worker, out.worker_pid)
        self._remaining[sent] -= 1
        if self._remaining[sent] == 0:
            del self._remaining[sent]
            sent.answer = None
        return out

    # ------------------------------------------------------------ how a batch reaches a worker
    def _send(self, worker: int, kind: str, handle: Any, batch: list) -> _Sent:
        """A batch to a worker: through its compiled graph where that is up and no plain call
        still runs there (a worker runs one batch at a time), else by a plain call."""
        sent = _Sent(worker, kind, handle, batch)
        if self._use_links and not self._linking:
            now = time.monotonic()
            self._first_send = self._first_send or now
            if now - self._first_send >= self._link_after:
                self._start_links()
        link = self._link(worker)
        if link is not None and len(self._linked[worker]) >= MAX_IN_FLIGHT:
            self._read(self._linked[worker][0])
            link = self._link(worker)  # None if that read found the link broken
        if link is not None:
            try:
                sent.ref = link.execute((kind, handle, batch, self.data))
                sent.link = link
                self._linked[worker].append(sent)
                self.sent["link"] += 1
                return sent
            except Exception as e:  # noqa: BLE001 - Ray closed the graph (its worker died)
                self._unlink(worker, f"{type(e).__name__}: {e}")
        self._call(sent)
        return sent

    def _link(self, worker: int) -> WorkerLink | None:
        link = self._links.get(worker)
        if link is None or not link.ready:
            return None
        called = self._called[worker]
        if called:  # plain calls that have finished no longer count
            done, _ = ray.wait([c.ref for c in called], num_returns=len(called), timeout=0)
            ready = set(done)
            self._called[worker] = called = [c for c in called if c.ref not in ready]
        return None if called else link

    def _call(self, sent: _Sent) -> None:
        handle = self.workers[sent.worker]
        if sent.kind == "train":
            n = len(sent.batch)
            call = handle.run_batch.options(num_returns=n + 1 + n * self._hold)
            sent.ref, *rest = call.remote(sent.handle, sent.batch, self.data, self._hold)
            sent.states, sent.deltas = rest[:n], rest[n:]
        else:
            sent.ref = handle.evaluate_batch.remote(sent.handle, sent.batch, self.data)
        sent.link = None
        self._called[sent.worker].append(sent)
        self.sent["call"] += 1

    def _read(self, sent: _Sent) -> list[Any]:
        """A batch's answer (read once, then kept until its last job is taken). A training
        result gets its personal state as an object ref from a plain call, as a value (which the
        client's next job carries back) through a link: a ``ray.put`` per state would cost
        about 1 ms each, against the link's 0.1 ms for the whole batch."""
        if sent.answer is not None:
            return sent.answer
        if sent.link is None:
            answer = ray.get(sent.ref)
            if sent in self._called[sent.worker]:
                self._called[sent.worker].remove(sent)
            states = sent.states
        else:
            try:
                answer = pickle.loads(sent.link.fetch(sent.ref))
            except Exception as e:  # noqa: BLE001 - the same batch goes again as a plain call
                self._unlink(sent.worker, f"{type(e).__name__}: {e}")
                return self._read(sent)
            self._linked[sent.worker].remove(sent)
            if sent.kind == "train":  # the states come back as values, kept as they are
                answer, *states = answer
        if sent.kind == "train":
            for r, state in zip(answer, states, strict=True):
                if r.state is None:
                    r.state = state
            for r, ref in zip(answer, sent.deltas, strict=False):  # none through a link
                if isinstance(r.delta, LeftOnNode):
                    r.delta = self.sums.hold(ref, r.delta.shape, r.delta.nbytes, r.node)
        sent.answer = answer
        return answer

    def wait_for_links(self, timeout_s: float = 60.0) -> bool:
        """Build the links now and wait until each is up or failed; True if all are up."""
        if self._use_links and not self._linking:
            self._start_links()
        deadline = time.monotonic() + timeout_s
        links = list(self._links.values())
        while time.monotonic() < deadline:
            if all(link.ready or link.failed for link in links):
                break
            time.sleep(0.02)
        return bool(self._use_links) and all(link.ready for link in links)

    def _unlink(self, worker: int, why: str) -> None:
        """Give up a worker's compiled graph (the worker died, or its batch failed): the batches
        sent through it and not yet read go again, in order, as plain calls, which Ray retries
        on the worker's restarted process, or which raise the batch's own error."""
        link = self._links.pop(worker, None)
        if link is None:
            return
        logging.getLogger("raysim").debug("worker %d: plain calls from now on (%s)", worker, why)
        pending, self._linked[worker] = self._linked[worker], []
        if not link.close(s.ref for s in pending):  # its loop may still run: never two at once
            ray.kill(self.workers[worker], no_restart=False)
        for sent in pending:
            self._call(sent)

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
        chunks = [jobs[bounds[w] : bounds[w + 1]] for w in range(n)]
        sent = [self._send(w, "evaluate", handle, chunk) for w, chunk in enumerate(chunks)]
        return lambda: [r for s in sent for r in self._read(s)]

    def initial_global(self) -> tuple[np.ndarray, Any]:
        weights, layout = ray.get(self.workers[0].initial_global.remote(self.data))
        if weights.nbytes > LINK_MAX_BYTES:  # before any link is built (``LINK_AFTER_S``)
            self._use_links = False  # a round's fixed costs are a small share there
            self._hold = self._may_hold  # and its deltas worth leaving where they are
        return weights, layout

    def kill_worker(self, index: int) -> None:
        """Fault injection: kill a worker while its batch runs, and wait until its restarted
        process answers. Ray's kill lands when it lands: during the batch (the batch runs again
        on the new process) or after it, when only a later call would have met the new process,
        perhaps on a coordinator that no longer knew the old one. Either way the restart is
        seen here, in the round the fault names."""
        worker = index % len(self.workers)
        handle = self.workers[worker]
        ray.kill(handle, no_restart=False)
        self._unlink(worker, "killed by faults.kill_worker")
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
        return [{"worker": i, **info, "early": i < self.early} for i, info in enumerate(infos)]

    def sum_counts(self) -> tuple[int, dict[str, float]]:
        """Bytes that reached this process through partial sums, and the reducers' seconds by
        node, since the last call (``NodeSums.take_counts``)."""
        return self.sums.take_counts()

    def close(self) -> None:
        self.sums.close()
        for worker, link in self._links.items():
            link.close(s.ref for s in self._linked[worker])  # unread at the run's end
        self._links = {}
        for w in self.workers:
            ray.kill(w)
        self.workers = []


def busy_workers(cfg: RunConfig, size: int, group: int) -> int:
    """Workers a round keeps busy, of a pool of ``size``: with ``workers.count: auto``, groups of
    ``group`` jobs and no delays (each round's jobs finish before the next round's start), a
    round is ``group_count(per_round, group)`` groups; otherwise the whole pool."""
    if cfg.workers.count != "auto" or group == 1 or cfg.delays.kind != "none":
        return size
    return max(1, min(size, group_count(cfg.clients.per_round, group)))


def batch_handle(handle: Any, by_job: dict[int, Any] | None, batch: list[ClientJob]) -> Any:
    """What a batch starts from: ``handle``, or where each job has its own (``by_job``), one
    handle for the batch when they agree, else the list of the batch's, in its order."""
    if by_job is None:
        return handle
    return one_or_each([by_job[j.job_id] for j in batch])


class _Sent:
    """One batch sent to one worker, through its link (``ref`` a ``CompiledDAGRef``) or by a
    plain call (``ref`` an object ref; ``states``: the jobs' personal states, by reference)."""

    def __init__(self, worker: int, kind: str, handle: Any, batch: list) -> None:
        self.worker, self.kind, self.handle, self.batch = worker, kind, handle, batch
        self.link: WorkerLink | None = None
        self.ref: Any = None
        self.states: list[Any] = []
        self.deltas: list[Any] = []  # ``workers.partial_sums``: each job's delta, by reference
        self.answer: list[Any] | None = None
