"""The coordinator: virtual clock, model versions, strategy, staleness, evaluation, tracking.

``CoordinatorCore`` is plain Python (testable and benchmarkable without Ray); ``Coordinator`` is its
Ray actor form, which builds the dataset, the worker pool and the MLflow tracker itself. The driver
only calls ``step()`` until ``done``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from raysim.actors.executor import Executor
from raysim.actors.jobs import ClientJob, job_groups, one_or_each
from raysim.algorithms.base import Diverged, Downlink, Strategy, Update
from raysim.algorithms.context import ServerContext
from raysim.algorithms.hooks import compose
from raysim.algorithms.registry import MIXERS, get_method
from raysim.config import RunConfig
from raysim.errors import LeakError
from raysim.security.policy import audit_off_warning, audits_leaks
from raysim.sim.build import weights_digest
from raysim.sim.clock import ArrivalQueue, PendingJob, Schedule
from raysim.sim.delays import build_delay_model
from raysim.state.store import (
    StateStoreError,
    StoredState,
    load_entry,
    open_store,
    run_folder,
    store_at,
)
from raysim.tracking import timeline

#: ``evaluator(global weights, client personal states, is_final_eval, round) -> metrics``; one
#: with ``submit`` (``WorkerEvaluator``) is started at the round's end and read when settled
Evaluator = Callable[[np.ndarray, dict, bool, int], dict[str, float]]


#: the most per-client rows a finished run hands back to its driver (``Result.clients``)
RESULT_ROWS = 100_000
#: ``CoordinatorCore.client_table``'s columns
CLIENT_COLUMNS = (
    "client",
    "num_samples",
    "dispatched",
    "arrived",
    "rejected",
    "dropped_late",
    "mean_train_loss",
    "mean_staleness_rounds",
    "last_round",
)


@dataclass(slots=True)
class ClientStats:
    """Per-client counters for the per-client metrics table (kept for clients that were
    dispatched only: a population of 10^6 that a run visits 2,000 times holds 2,000)."""

    dispatched: int = 0
    arrived: int = 0
    rejected: int = 0
    dropped_late: int = 0
    num_samples: int = 0
    train_loss_sum: float = 0.0
    staleness_sum: int = 0
    last_round: int = -1


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


#: Per-round metrics that measure wall-clock time: they differ between two runs of one config,
#: every other metric does not (docs/execution.md, "What deterministic promises").
TIMING_METRICS = frozenset(
    {"wall_time", "round_wall_s", "round_wait_s", "round_compute_s"}
    | {"server_wall_s", "audit_wall_s"}
)


@dataclass
class RoundLog:
    """Accumulates what happens inside one round."""

    arrived: int = 0
    rejected: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    tau_rounds: list[int] = field(default_factory=list)
    tau_versions: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    client_metrics: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    wait_s: float = 0.0
    server_s: float = 0.0
    audit_s: float = 0.0
    #: each worker process's seconds of client work among this round's arrivals
    compute_s: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    leaks: int = 0  # payloads that leaked and went out (audit.on_leak: report)
    server_metrics: dict[str, float] = field(default_factory=dict)


class CoordinatorCore:
    """Steps a run one round of virtual time at a time (feddle.md §2.3).

    Per round k: (1) dispatch the schedule's clients on the current version, with what
    ``strategy.configure`` sends them, and start their jobs; (2) deliver the updates whose arrival
    round is k, by arrival time then client id, rejecting non-finite ones; (3)
    ``strategy.on_round_end``; (4) evaluate every ``eval.every`` rounds. Jobs that would arrive
    after the last round are dispatched (they count) but never computed. ``server`` is what the
    strategy computes with (``ServerContext``); without one it gets a bare vector layout.
    """

    def __init__(
        self,
        cfg: RunConfig,
        initial: np.ndarray,
        client_sizes: np.ndarray,
        executor: Executor,
        evaluator: Evaluator | None = None,
        tracker: Any | None = None,
        server: ServerContext | None = None,
        state_root: str | None = None,
    ) -> None:
        """``state_root``: with ``clients.state.store: disk``, the run's store (default: a new
        folder inside ``clients.state.dir``); a resumed run keeps its checkpoint's."""
        self.cfg = cfg
        self.executor = executor
        self.evaluator = evaluator
        self.tracker = tracker
        method = get_method(cfg.algorithm.name)
        self.method = method
        self.server = server or ServerContext.minimal(cfg.seed, len(initial), cfg.clients.num)
        self.server._log = self._server_metric
        self._log = RoundLog()
        self.strategy: Strategy = self._build_strategy(initial)
        self.auditor = None
        if audits_leaks(cfg):  # in torch: imported only where it runs
            from raysim.security.audit import LeakAuditor

            secrets = self.strategy.secrets()
            self.auditor = LeakAuditor(
                secrets,
                len(initial),
                self.server.device,
                cfg.audit.windows,
                transposes=cfg.audit.transposes,
            )
        delay_model = build_delay_model(cfg.delays, cfg.clients.num, cfg.seed)
        self.schedule = Schedule(cfg.clients.num, cfg.clients.per_round, delay_model, cfg.seed)
        self.queue = ArrivalQueue()
        self.client_sizes = client_sizes
        self.round = 0
        self.version = 0
        self._versions: dict[int, _Version] = {}
        self._broadcasts: dict[int, _Broadcast] = {}  # by dispatch round
        self._job_ids = 0
        #: each submission's jobs, (job id, client, dispatch round) in schedule order, by the
        #: round it went out in, while any is in flight: a resumed run re-forms the groups that
        #: trained together from them
        self._submissions: dict[int, list[tuple[int, int, int]]] = {}
        #: ``workers.late_jobs: together``: jobs dispatched and not sent yet (each with its
        #: version's handle), sent together when the first of them is due (``_send_due``)
        self._jobs_wait = cfg.workers.late_jobs == "together" and 1 < cfg.group_size() < sys.maxsize
        self._waiting: list[tuple[ClientJob, int, int]] = []  # (job, version, arrival round)
        self.stats: dict[int, ClientStats] = defaultdict(ClientStats)
        #: Personal state per client (simulated client storage; the strategy never sees it).
        #: personal state by client: arrays, or executor handles (``materialized_states``)
        self.client_states: dict[int, Any] = {}
        #: ``clients.state.store: disk``: where new versions go, and who still reads each
        #: stored version: the job it was sent with and a pending evaluation (by count), the
        #: newest checkpoint (a set); one nothing reads and no client holds is deleted
        self.state_root = state_root
        if cfg.clients.state.store == "disk" and state_root is None:
            self.state_root = run_folder(cfg.clients.state.dir)
        self._store_opened = False  # made and marked with the first job that may write to it
        self._readers: defaultdict[StoredState, int] = defaultdict(int)
        self._job_states: dict[int, StoredState] = {}
        self._eval_states: list[StoredState] = []
        self._checkpointed: set[StoredState] = set()
        self.history: list[dict[str, float]] = []
        self.evaluations: list[dict[str, float]] = []
        #: a round's evaluation still running (``step(settle=False)``): round, metrics, fetch
        self._pending: tuple[int, dict[str, float], Callable[[], dict]] | None = None
        self.totals = defaultdict(float)
        self._started = time.perf_counter()

    def _build_strategy(self, initial: np.ndarray) -> Strategy:
        """The method's strategy, composed with ``hooks.server`` mixers, set up on the server."""
        cfg = self.cfg
        base = self.method.strategy(cfg.algorithm.params, initial, cfg.clients.num)
        mixers = [MIXERS.get(h.name).build(h.params) for h in cfg.hooks.server]
        strategy = compose(base, mixers)
        strategy.setup(self.server)
        return strategy

    def _server_metric(self, name: str, value: float) -> None:
        self._log.server_metrics[name] = value

    def _timed(self, call, *args):
        """Run a strategy hook, adding its wall time to the round's server seconds."""
        t0 = time.perf_counter()
        try:
            return call(*args)
        finally:
            self._log.server_s += time.perf_counter() - t0

    def _audit(self, payload: Any, where: str) -> None:
        """The leak auditor's check of a payload (when on), timed into the round's audit_s."""
        if self.auditor is None:
            return
        t0 = time.perf_counter()
        try:
            self.auditor.check(payload, where)
        except LeakError as leak:
            if self.cfg.audit.on_leak == "stop":
                raise
            self._log.leaks += 1
            self.totals["leaks_reported"] += 1
            found = str(leak).removeprefix("stopped: ")
            self.warn(f"leak (audit.on_leak=report, sent anyway): {found}")
        finally:
            self._log.audit_s += time.perf_counter() - t0

    # ----------------------------------------------------------------- model versions
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

    def _client_job(self, job_id: int, client: int, dispatch_round: int) -> ClientJob:
        """The job a dispatched client runs: its stored personal state and its downlink."""
        state = self.client_states.get(client)
        if isinstance(state, StoredState):
            self._readers[state] += 1
            self._job_states[job_id] = state
        b = self._broadcasts.get(dispatch_round)
        if b is None:
            return ClientJob(
                job_id, client, dispatch_round, self.cfg.seed, state, store=self._job_store()
            )
        own = b.downlink.per_client.get(client)
        return ClientJob(
            job_id,
            client,
            dispatch_round,
            self.cfg.seed,
            state,
            b.handle,
            dict(own or {}) or None,
            store=self._job_store(),
        )

    def _job_store(self) -> str | None:
        """The store a job writes its client's new version to (made on the first call)."""
        if self.state_root is not None and not self._store_opened:
            open_store(self.state_root)
            self._store_opened = True
        return self.state_root

    def _unread(self, stored: StoredState) -> None:
        """One reader of ``stored`` is done; delete it if nothing else can read it."""
        left = self._readers[stored] - 1
        if left > 0:
            self._readers[stored] = left
            return
        self._readers.pop(stored, None)
        self._collect(stored)

    def _collect(self, stored: StoredState) -> None:
        if (
            stored not in self._readers
            and self.client_states.get(stored.client) != stored
            and stored not in self._checkpointed
        ):
            store_at(stored.root).delete(stored)

    def stored_states(self) -> set[StoredState]:
        """The clients' current versions on disk (``clients.state.store: disk``)."""
        return {s for s in self.client_states.values() if isinstance(s, StoredState)}

    def checkpoint_written(self, everywhere: bool = True) -> None:
        """The checkpoint of ``state_dict()`` is durable: the stored versions it refers to are
        kept from now on, and those only the previous one kept can go. Not ``everywhere`` (in
        ``checkpoint.dir`` but not in the tracking store): the previous one's are kept too,
        since the store's checkpoint still refers to them."""
        before = self._checkpointed
        self._checkpointed = self.stored_states() | (set() if everywhere else before)
        for stored in before - self._checkpointed:
            self._collect(stored)

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

    # ----------------------------------------------------------------- the round
    @property
    def done(self) -> bool:
        return self.round >= self.cfg.rounds

    def step(self, settle: bool = True) -> dict[str, float]:
        """Advance the virtual clock by one round and return that round's metrics.

        ``settle=False`` lets the round's evaluation run on the workers while the next round
        is dispatched behind it: the returned metrics lack it until the next ``step`` or
        ``settle`` adds it (to the same dict) and logs the round. Nothing else changes: the
        workers run the same jobs in the same order."""
        if self.done:
            raise RuntimeError("the run is finished")
        k, t0 = self.round, time.perf_counter()
        if not self.history:  # this process's first round (a resumed run says it again)
            for line in self.strategy.notices():
                self.warn(line)
            if off := audit_off_warning(self.cfg):
                self.warn(off)
        log = self._log = RoundLog()
        try:
            with timeline.span("dispatch", k):
                self._dispatch(k, log)
                self._send_due(k)
            if self.cfg.faults.kill_worker and self.cfg.faults.kill_worker.round == k:
                self.executor.kill_worker(self.cfg.faults.kill_worker.worker)
        finally:
            self.settle()  # the last round's evaluation, queued ahead of this round's jobs
        with timeline.span("arrivals", k):
            for job in self.queue.pop_round(k):
                self._deliver(job, k, log)
        with timeline.span("round end (server)", k):
            self._bump(self._timed(self.strategy.on_round_end, k))
        self.round += 1
        if len(self._submissions) > 64:
            self._live_submissions()
        if self.done:
            for job in self.queue.drop_after(k):
                self.stats[job.client].dropped_late += 1
                self._release(job.dispatch_version)
                self._release_broadcast(job.dispatch_round)
        with timeline.span("metrics, evaluation sent", k):
            metrics = self._round_metrics(k, log, time.perf_counter() - t0)
        self.history.append(metrics)
        if self._pending is None:  # no evaluation this round: logged now
            if self.tracker is not None:
                with timeline.span("log round", k):
                    self.tracker.log_round(k + 1, metrics)
        elif settle or self.done:
            self.settle()  # logged with its evaluation
        return metrics

    def settle(self) -> None:
        """Wait for a round's evaluation left running by ``step(settle=False)``: its metrics
        join the round's, which is then logged."""
        if self._pending is None:
            return
        k, metrics, fetch = self._pending
        self._pending = None
        with timeline.span("evaluation wait", k):
            ev = fetch()
        read, self._eval_states = self._eval_states, []
        for stored in read:
            self._unread(stored)
        self.evaluations.append({"round": float(k + 1), **ev})
        metrics.update(ev)
        if self.tracker is not None:
            with timeline.span("log round", k):
                self.tracker.log_round(k + 1, metrics)

    def _dispatch(self, k: int, log: RoundLog) -> None:
        if not self.strategy.uses_clients:
            return  # a server-only method (Center) touches no client (feddle.md I-13)
        d = self.schedule.dispatch(k)
        self._warn_unused_faults(k, set(d.clients.tolist()))
        if not len(d):
            return
        v = self._current_handle()
        downlink = self._timed(self.strategy.configure, k, d.clients.tolist())
        if downlink is not None and (downlink.tensors or downlink.per_client):
            payload = [dict(downlink.tensors), dict(downlink.per_client)]
            self._audit(payload, f"round {k}'s downlink")
            b = _Broadcast(downlink, self.executor.put(dict(downlink.tensors)), len(d))
            self._broadcasts[k] = b
            log.bytes_down += sum(downlink.nbytes(c) for c in d.clients.tolist())
        jobs = []
        for client, t_arr, r_arr in zip(
            d.clients.tolist(), d.arrival_times.tolist(), d.arrival_rounds.tolist(), strict=True
        ):
            self._job_ids += 1
            st = self.stats[client]
            st.dispatched += 1
            v.refs += 1
            self.queue.push(PendingJob(client, k, self.version, t_arr, r_arr, self._job_ids))
            if r_arr < self.cfg.rounds:
                jobs.append(self._client_job(self._job_ids, client, k))
                if self._jobs_wait:
                    self._waiting.append((jobs[-1], self.version, r_arr))
        log.bytes_down += len(d) * v.weights.nbytes
        if jobs and not self._jobs_wait:
            self._submissions[k] = [(j.job_id, j.client, k) for j in jobs]
            self.executor.submit(v.handle, jobs)

    def _send_due(self, k: int) -> None:
        """``workers.late_jobs: together``: once a waiting job is due in round ``k``, waiting
        jobs go out in one submission, each on its own version, earliest arrival first (ties
        by job id): as many full groups (``job_groups``) as the due jobs need, the last one
        filled up with jobs due later; the rest keep waiting for the next submission, so no
        group is sent short while jobs still wait. Which jobs train together follows from
        the schedule alone, so results do not depend on the pool, a killed worker or a
        resume."""
        due = sum(1 for _, _, r in self._waiting if r <= k)
        if not due:
            return
        size = self.cfg.group_size()
        ordered = sorted(self._waiting, key=lambda w: (w[2], w[0].job_id))
        cut = -(-due // size) * size
        sending, self._waiting = ordered[:cut], ordered[cut:]
        jobs = [job for job, _, _ in sending]
        self._submissions[k] = [(j.job_id, j.client, j.dispatch_round) for j in jobs]
        self.executor.submit(one_or_each([self._versions[v].handle for _, v, _ in sending]), jobs)

    def _warn_unused_faults(self, k: int, dispatched: set[int]) -> None:
        """A ``faults.corrupt_updates`` entry whose client is not sampled that round corrupts
        nothing: say so rather than let the experiment look clean by accident."""
        for f in self.cfg.faults.corrupt_updates:
            if f.round == k and f.client not in dispatched:
                self.warn(
                    f"round {k}: faults.corrupt_updates names client {f.client}, which is not "
                    "dispatched this round; nothing was corrupted"
                )

    def warn(self, message: str) -> None:
        """A console line, kept in the run's ``warnings.txt`` too."""
        if self.tracker is not None:
            self.tracker.warn(message)
        else:
            logging.getLogger("raysim").warning(message)

    def _deliver(self, job: PendingJob, k: int, log: RoundLog) -> None:
        t0 = time.perf_counter()
        with timeline.span("result wait", k):
            result = self.executor.result(job.job_id)
        log.wait_s += time.perf_counter() - t0
        read = self._job_states.pop(job.job_id, None)
        if read is not None:  # the job's worker is done with the version it was sent
            self._unread(read)
        self._release_broadcast(job.dispatch_round)
        log.compute_s[result.worker_pid] += result.seconds
        st = self.stats[job.client]
        log.bytes_up += result.delta.nbytes + sum(a.nbytes for a in result.extras.values())
        if not np.isfinite(result.delta).all():
            if isinstance(result.state, StoredState):  # the version it saved is never adopted
                self._collect(result.state)
            if self.strategy.stop_on_nonfinite:
                raise Diverged(
                    f"round {k}: client {job.client}'s update is not finite (the method stops "
                    "on divergence; lower its step sizes)"
                )
            st.rejected += 1
            log.rejected += 1
            self.totals["rejected_updates"] += 1
            if self.tracker is not None:
                self.tracker.warn(
                    f"round {k}: rejected a non-finite update from client {job.client}"
                )
            self._release(job.dispatch_version)
            return
        if not isinstance(result.state, dict) or result.state:
            # personal state stays client-side: a handle kept here, never given to the server
            old = self.client_states.get(job.client)
            self.client_states[job.client] = result.state
            if isinstance(old, StoredState) and old != result.state:
                self._collect(old)
        base = self._versions[job.dispatch_version].weights
        update = Update(
            client_id=job.client,
            delta=result.delta,
            num_samples=result.num_samples,
            dispatch_round=job.dispatch_round,
            dispatch_version=job.dispatch_version,
            arrival_time=job.arrival_time,
            arrival_round=k,
            tau_versions=self.version - job.dispatch_version,
            base=base,
            metrics=result.metrics,
            extras=result.extras,
        )
        self._release(job.dispatch_version)
        log.arrived += 1
        log.tau_rounds.append(update.tau_rounds)
        log.tau_versions.append(update.tau_versions)
        for key, value in result.metrics.items():
            if key != "train_loss":
                log.client_metrics[key].append(float(value))
        loss = result.metrics.get("train_loss")
        if loss is not None:
            log.train_loss.append(loss)
            st.train_loss_sum += loss
        st.arrived += 1
        st.num_samples = result.num_samples
        st.staleness_sum += update.tau_rounds
        st.last_round = k
        self._bump(self._timed(self.strategy.on_arrival, update))

    def _round_metrics(self, k: int, log: RoundLog, wall: float) -> dict[str, float]:
        evaluating = self.evaluator is not None and (
            (k + 1) % self.cfg.eval.every == 0 or self.done
        )
        # evaluated on the workers: the version the next dispatch sends too, published (and
        # audited) now, so that its audit counts in this round's audit_wall_s
        v = self._current_handle() if evaluating and hasattr(self.evaluator, "submit") else None
        self.totals["bytes_up"] += log.bytes_up
        self.totals["bytes_down"] += log.bytes_down
        self.totals["arrived"] += log.arrived
        m: dict[str, float] = {
            "round": float(k + 1),  # its number, 1 to rounds: the rounds done once it ends
            "virtual_time": float(k + 1),
            "wall_time": time.perf_counter() - self._started,
            "round_wall_s": wall,
            "round_wait_s": log.wait_s,
            # the busiest worker's client work: the round's compute on its critical path
            "round_compute_s": max(log.compute_s.values(), default=0.0),
            "server_wall_s": log.server_s,
            "clients_arrived": float(log.arrived),
            "clients_in_flight": float(len(self.queue)),
            "rejected_updates": float(log.rejected),
            "rejected_updates_total": self.totals["rejected_updates"],
            "bytes_up": float(log.bytes_up),
            "bytes_down": float(log.bytes_down),
            "model_version": float(self.version),
        }
        events = self.executor.events()
        if events:
            self.totals["worker_restarts"] = self.totals.get("worker_restarts", 0) + len(events)
            for event in events:
                self.warn(f"round {k}: {event}")
        m["worker_restarts"] = float(len(events))
        if self.auditor is not None:
            m["audit_wall_s"] = log.audit_s
            if self.cfg.audit.on_leak == "report":
                m["leaks_reported"] = float(log.leaks)
        if log.tau_rounds:
            m["staleness_rounds_mean"] = float(np.mean(log.tau_rounds))
            m["staleness_rounds_max"] = float(np.max(log.tau_rounds))
            m["staleness_versions_mean"] = float(np.mean(log.tau_versions))
            m["staleness_versions_max"] = float(np.max(log.tau_versions))
        if log.train_loss:
            m["train_loss"] = float(np.mean(log.train_loss))
        for key, values in sorted(log.client_metrics.items()):
            m[f"client_{key}"] = float(np.mean(values))  # mean over this round's arrivals
        m.update(self.strategy.metrics())
        if self.strategy.reads_client_states:
            states = {j: load_entry(s) for j, s in self.materialized_states().items()}
            m.update(self.strategy.state_metrics(states))
        m.update(log.server_metrics)
        if evaluating:
            # eval.clients: N scores the first N clients to have personal state: only theirs
            # are read (not a copy of 10^6 clients' entries each round)
            n, final = self.cfg.eval.clients, self.done
            states = dict(islice(self.client_states.items(), n) if n else self.client_states)
            self._eval_states = [s for s in states.values() if isinstance(s, StoredState)]
            for stored in self._eval_states:  # read by the evaluation until it settles
                self._readers[stored] += 1
            if v is not None:
                self._pending = (k, m, self.evaluator.submit(v.weights, states, final, k, v.handle))
            else:
                weights = self.strategy.weights
                self._pending = (k, m, lambda: self.evaluator(weights, states, final, k))
        return m

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit-identically
        (``raysim/state/checkpoint.py``).

        Values are snapshots or references to objects that the next ``step`` replaces rather
        than mutates, except ``strategy`` (the live object): serialise before stepping again.
        Arrays sit in plain nested dicts (``versions``, ``client_states``) so that a checkpoint
        can store them as safetensors.
        """
        self.settle()
        state: dict[str, Any] = {
            "round": self.round,
            "version": self.version,
            "job_ids": self._job_ids,
            "submissions": self._live_submissions(),
            "waiting": [job.job_id for job, _, _ in self._waiting],
            "schedule": self.schedule.state_dict(),
            "queue": self.queue.state_dict(),
            # weights of every version that in-flight jobs were dispatched on (and the current)
            "versions": {
                v: {"weights": ver.weights, "refs": ver.refs} for v, ver in self._versions.items()
            },
            # the strategy's own state_dict (private state apart: ``checkpoint.py`` writes it to
            # its own file; what setup() rebuilds is not saved at all)
            "strategy": self.strategy.state_dict(),
            "strategy_private": self.strategy.private_state(),
            "broadcasts": {
                k: {
                    "tensors": dict(b.downlink.tensors),
                    "per_client": dict(b.downlink.per_client),
                    "refs": b.refs,
                }
                for k, b in self._broadcasts.items()
            },
            "client_stats": stats_columns(self.stats),
            "client_states": self.materialized_states(),
            "state_root": self.state_root,
            "history": [dict(h) for h in self.history],
            "evaluations": [dict(e) for e in self.evaluations],
            "totals": dict(self.totals),
            "wall_elapsed": time.perf_counter() - self._started,
        }
        if hasattr(self.evaluator, "state_dict"):
            state["evaluator"] = self.evaluator.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` into a freshly built core and restart its in-flight jobs.

        In-flight jobs that the original run computed (arrival before the last round) are
        submitted again, on the weights of their dispatch version and with the client's stored
        personal state: a client is not dispatched again while in flight and only its own
        arrival replaces its state, so the stored state is the one it was dispatched with.
        Their results are the same as the lost ones (client RNG depends only on seed, client
        and dispatch round).
        """
        if self.round or self._job_ids:
            raise RuntimeError("load_state_dict needs a core that has not stepped yet")
        self.strategy.load_state_dict(state["strategy"])
        self.strategy.load_private_state(state.get("strategy_private", {}))
        self._broadcasts = {
            int(k): _Broadcast(
                Downlink(b["tensors"], {int(c): t for c, t in b["per_client"].items()}),
                self.executor.put(dict(b["tensors"])),
                int(b["refs"]),
            )
            for k, b in state.get("broadcasts", {}).items()
        }
        self.round = int(state["round"])
        self.version = int(state["version"])
        self._job_ids = int(state["job_ids"])
        self._submissions = {  # (job, client), dispatched in round k, before version 2
            int(k): [(int(e[0]), int(e[1]), int(e[2] if len(e) > 2 else k)) for e in sub]
            for k, sub in state.get("submissions", {}).items()
        }
        self.schedule.load_state_dict(state["schedule"])
        self.queue.load_state_dict(state["queue"])
        self.stats = defaultdict(ClientStats, stats_from_columns(state))
        self.client_states = {
            int(j): st if isinstance(st, StoredState) else dict(st)
            for j, st in state["client_states"].items()
        }
        self.state_root = state.get("state_root") or self.state_root
        # the checkpoint resumed from may be resumed again: its versions stay
        self._checkpointed = self.stored_states()
        gone = sorted({s.root for s in self._checkpointed if not os.path.isdir(s.root)})
        if gone:
            raise StateStoreError(
                f"the run's personal-state store {gone[0]} is gone: its checkpoint refers to "
                "the clients' states there (clients.state.store: disk); a resume needs it back"
            )
        self.history = [dict(h) for h in state["history"]]
        self.evaluations = [dict(e) for e in state["evaluations"]]
        self.totals = defaultdict(float, state["totals"])
        self._started = time.perf_counter() - float(state.get("wall_elapsed", 0.0))
        if "evaluator" in state and hasattr(self.evaluator, "load_state_dict"):
            self.evaluator.load_state_dict(state["evaluator"])
        self._versions = {}
        for v, saved in state["versions"].items():
            self._versions[int(v)] = self._publish(saved["weights"], int(saved["refs"]))
        pending = [j for j in self.queue.jobs() if j.arrival_round < self.cfg.rounds]
        for job in pending:
            if job.dispatch_version not in self._versions:
                raise ValueError(f"checkpoint lacks model version {job.dispatch_version}")
        waiting = set(state.get("waiting", []))
        self._waiting = [
            (
                self._client_job(j.job_id, j.client, j.dispatch_round),
                j.dispatch_version,
                j.arrival_round,
            )
            for j in sorted(pending, key=lambda j: j.job_id)
            if j.job_id in waiting
        ]
        pending = [j for j in pending if j.job_id not in waiting]
        size = getattr(self.executor, "group_size", 1)
        sent = {e[0] for sub in self._submissions.values() for e in sub}
        if size > 1 and all(j.job_id in sent for j in pending):
            self._resubmit_groups(pending, size)
            return
        by_version: dict[int, list[ClientJob]] = defaultdict(list)
        for job in sorted(pending, key=lambda j: j.job_id):
            by_version[job.dispatch_version].append(
                self._client_job(job.job_id, job.client, job.dispatch_round)
            )
        for v, jobs in by_version.items():
            self.executor.submit(self._versions[v].handle, jobs)

    def _resubmit_groups(self, pending: list[PendingJob], size: int) -> None:
        """In-flight jobs that trained in groups (batched execution, or clients that train
        together) go out again in their original groups: a batched client's float rounding
        depends on its group's shapes, so each group is re-formed from its submission
        (``job_groups``), mates that arrived before the checkpoint included (on a pending
        mate's version: only their shapes count); their results are fetched and dropped."""
        wanted = {j.job_id: j for j in pending}
        mates: list[int] = []
        for k in sorted(self._submissions):
            for group in job_groups(self._submissions[k], size):
                ids = [job_id for job_id, _, _ in group]
                if not any(i in wanted for i in ids):
                    continue
                first = next(wanted[i].dispatch_version for i in ids if i in wanted)
                versions = [wanted[i].dispatch_version if i in wanted else first for i in ids]
                jobs = [self._client_job(job_id, client, r) for job_id, client, r in group]
                self.executor.submit(
                    one_or_each([self._versions[v].handle for v in versions]), jobs
                )
                mates += [i for i in ids if i not in wanted]
        for job_id in mates:
            self.executor.result(job_id)

    def _live_submissions(self) -> dict[int, list[tuple[int, int, int]]]:
        """``_submissions`` with a job in flight (the rest are dropped)."""
        live = {j.job_id for j in self.queue.jobs()}
        self._submissions = {
            k: v for k, v in self._submissions.items() if any(e[0] in live for e in v)
        }
        return dict(self._submissions)

    # ----------------------------------------------------------------- results
    @property
    def weights(self) -> np.ndarray:
        return self.strategy.weights

    def final_states(self) -> tuple[dict[int, Any], str | None]:
        """What the run's end records of clients' personal state (``tracking.client_states``):
        arrays by client, ``StoredState``s (a manifest of the store on disk) or nothing, and
        the line that says why, where ``auto`` chose less than the arrays."""
        mode = self.cfg.tracking.client_states
        limit = self.cfg.tracking.client_states_max_mb * 2**20
        if mode == "none" or not self.client_states:
            return {}, None
        stored = self.stored_states()
        if stored:
            total = sum(s.nbytes for s in stored)
            if mode == "manifest" or (mode == "auto" and total > limit):
                note = None
                if mode == "auto":
                    note = (
                        f"clients' personal state ({total / 2**30:.2f} GiB) is above "
                        "tracking.client_states_max_mb: the run logs client_states.json, a "
                        f"manifest of its store at {self.state_root}, instead of the arrays"
                    )
                return dict(self.client_states), note
            return {j: dict(load_entry(s)) for j, s in self.client_states.items()}, None
        if mode == "auto":
            first = self.executor.get(next(iter(self.client_states.values())))
            total = sum(np.asarray(v).nbytes for v in first.values()) * len(self.client_states)
            if total > limit:
                return {}, (
                    f"clients' personal state (about {total / 2**30:.2f} GiB) is not logged: "
                    "it is above tracking.client_states_max_mb; clients.state.store=disk keeps "
                    "it on disk and logs a manifest, tracking.client_states=arrays logs it anyway"
                )
        return self.materialized_states(), None

    def materialized_states(self) -> dict[int, dict[str, np.ndarray]]:
        """Every client's personal state as arrays (``client_states`` may hold references); a
        state on disk stays its ``StoredState`` (a checkpoint refers to the file)."""
        out = {}
        for j, st in self.client_states.items():
            value = self.executor.get(st)
            out[j] = value if isinstance(value, StoredState) else dict(value)
        return out

    def final_metrics(self) -> dict[str, float]:
        self.settle()
        out: dict[str, float] = {}
        if self.evaluations:
            last = self.evaluations[-1]
            out.update({k: v for k, v in last.items() if k != "round"})
            window = self.evaluations[-self.cfg.eval.final_window :]
            if "accuracy" in last:
                out["accuracy_max_last"] = max(e["accuracy"] for e in window)
        out["wall_time_s"] = time.perf_counter() - self._started
        out["rounds"] = float(self.round)
        out["virtual_time"] = float(self.round)
        out["total_bytes_up"] = self.totals["bytes_up"]
        out["total_bytes_down"] = self.totals["bytes_down"]
        out["total_updates"] = self.totals["arrived"]
        out["rejected_updates"] = self.totals["rejected_updates"]
        if self.auditor is not None and self.cfg.audit.on_leak == "report":
            out["leaks_reported"] = self.totals["leaks_reported"]
        return out

    def client_table(self) -> Iterator[dict[str, float]]:
        """One row per client dispatched so far, in client order (made as it is read: a
        ``clients.csv`` of 10^6 rows is written row by row)."""
        for client in sorted(self.stats):
            s = self.stats[client]
            yield {
                "client": client,
                "num_samples": int(self.client_sizes[client]),
                "dispatched": s.dispatched,
                "arrived": s.arrived,
                "rejected": s.rejected,
                "dropped_late": s.dropped_late,
                "mean_train_loss": s.train_loss_sum / s.arrived if s.arrived else float("nan"),
                "mean_staleness_rounds": s.staleness_sum / s.arrived if s.arrived else float("nan"),
                "last_round": s.last_round,
            }

    def client_rows(self) -> Iterator[dict[str, Any]]:
        """``client_table`` joined with the last per-client evaluation, row by row."""
        last = {r["client"]: r for r in getattr(self.evaluator, "last_clients", [])}
        for row in self.client_table():
            row.update({k: v for k, v in last.get(row["client"], {}).items() if k != "client"})
            yield row

    def client_columns(self) -> list[str]:
        """``clients.csv``'s columns: the counters', then those of the last evaluation."""
        columns = dict.fromkeys(CLIENT_COLUMNS)
        for row in getattr(self.evaluator, "last_clients", []):
            columns.update(dict.fromkeys(row))
        return list(columns)

    def result_rows(self, limit: int = RESULT_ROWS) -> list[dict[str, Any]]:
        """The rows that go back to the driver (``Result.clients``): every row up to
        ``limit``; above, none, said in one line (``clients.csv`` has them)."""
        n = len(self.stats)
        if n <= limit:
            return list(self.client_rows())
        self.warn(
            f"{n} clients took part: Result.clients is left empty (it carries up to {limit} "
            "rows); the run's clients.csv artifact has every row"
        )
        return []

    def digest(self) -> str:
        return weights_digest(self.strategy.weights)


def stats_columns(stats: Mapping[int, ClientStats]) -> dict[str, np.ndarray]:
    """Per-client counters as columns (a checkpoint's ``client_stats``: arrays pickle at memory
    speed, where a dict per client of 10^6 would not)."""
    clients = sorted(stats)
    out = {"client": np.array(clients, dtype=np.int64)}
    zero = ClientStats()
    for name in ClientStats.__slots__:
        kind = np.float64 if isinstance(getattr(zero, name), float) else np.int64
        out[name] = np.fromiter((getattr(stats[c], name) for c in clients), kind, len(clients))
    return out


def stats_from_columns(state: Mapping[str, Any]) -> dict[int, ClientStats]:
    """``CoordinatorCore.stats`` from a checkpoint (columns; a dict per client before them)."""
    if "client_stats" not in state:
        return {int(j): ClientStats(**s) for j, s in state["stats"].items()}
    cols = state["client_stats"]
    names = ClientStats.__slots__
    rows = zip(*(cols[n].tolist() for n in names), strict=True)
    return {c: ClientStats(*row) for c, row in zip(cols["client"].tolist(), rows, strict=True)}
