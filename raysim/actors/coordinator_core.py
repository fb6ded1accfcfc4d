"""The coordinator: virtual clock, model versions, strategy, staleness, evaluation, tracking.

``CoordinatorCore`` is plain Python (testable and benchmarkable without Ray); ``Coordinator`` is its
Ray actor form, which builds the dataset, the worker pool and the MLflow tracker itself. The driver
only calls ``step()`` until ``done``.

The core steps the round (dispatch, arrivals, the strategy's round end, evaluation) here; its
parts live beside it, each holding its own state, and make it up as bases of the one class:
``core_versions`` (the published global models and downlinks), ``core_client_states`` (clients'
personal states and the store's holders), ``core_snapshot`` (``state_dict``/``load_state_dict``:
what a checkpoint holds) and ``core_report`` (round and final metrics, the per-client table).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from itertools import islice
from typing import Any

import numpy as np

from raysim.actors.core_client_states import ClientStates
from raysim.actors.core_report import (
    CLIENT_COLUMNS,
    RESULT_ROWS,
    TIMING_METRICS,
    ClientStats,
    RoundLog,
    RunReport,
)
from raysim.actors.core_snapshot import Snapshot, stats_columns, stats_from_columns
from raysim.actors.core_versions import ModelVersions
from raysim.actors.executor import Executor
from raysim.actors.jobs import STOPPED_EARLY, ClientJob, one_or_each
from raysim.algorithms.base import Diverged, Strategy, Update
from raysim.algorithms.context import ServerContext
from raysim.algorithms.hooks import compose
from raysim.algorithms.registry import MIXERS, get_method
from raysim.config import RunConfig
from raysim.errors import LeakError
from raysim.privacy.wrap import private
from raysim.robust.server import robust
from raysim.security.policy import audit_off_warning, audits_leaks
from raysim.sim.clock import ArrivalQueue, PendingJob, Schedule
from raysim.sim.delays import build_delay_model
from raysim.tracking import timeline

__all__ = [
    "CLIENT_COLUMNS",
    "RESULT_ROWS",
    "TIMING_METRICS",
    "ClientStats",
    "CoordinatorCore",
    "Evaluator",
    "RoundLog",
    "stats_columns",
    "stats_from_columns",
]

#: ``evaluator(global weights, client personal states, is_final_eval, round) -> metrics``; one
#: with ``submit`` (``WorkerEvaluator``) is started at the round's end and read when settled
Evaluator = Callable[[np.ndarray, dict, bool, int], dict[str, float]]


class CoordinatorCore(ModelVersions, ClientStates, Snapshot, RunReport):
    """Steps a run one round of virtual time at a time (Feddle spec §2.3).

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
        if cfg.devices.enabled:
            from raysim.devices.build import device_schedule

            self.schedule = device_schedule(cfg, client_sizes, initial.nbytes)
        else:
            delay_model = build_delay_model(cfg.delays, cfg.clients.num, cfg.seed)
            self.schedule = Schedule(
                cfg.clients.num, cfg.clients.per_round, delay_model, cfg.seed, cfg.clients.sampling
            )
        self.queue = ArrivalQueue()
        self.client_sizes = client_sizes
        self.round = 0
        self._init_versions()
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
        self._init_client_states(cfg, state_root)
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
        strategy = private(robust(compose(base, mixers), cfg), cfg)
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

    # ----------------------------------------------------------------- the round
    @property
    def done(self) -> bool:
        """All planned rounds run, or the strategy ended the run (``Strategy.stop_reason``)."""
        return self.round >= self.cfg.rounds or self.stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """Why the run ended before its planned rounds (after a round), as a finished run."""
        return self.strategy.stop_reason if self.round else None

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
        early = self.stop_reason is not None and self.round < self.cfg.rounds
        if early:
            self.warn(f"round {k}: {self.stop_reason}; the run ends here, finished")
        if len(self._submissions) > 64:
            self._live_submissions()
        if self.done:
            for job in self.queue.drop_after(k):
                self.stats[job.client].dropped_late += 1
                self._release(job.dispatch_version)
                self._release_broadcast(job.dispatch_round)
        with timeline.span("metrics, evaluation sent", k):
            metrics = self._round_metrics(k, log, time.perf_counter() - t0)
        if early:
            metrics[STOPPED_EARLY] = 1.0  # the driver's loop ends on it
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
        self._evaluation_read()
        self.evaluations.append({"round": float(k + 1), **ev})
        metrics.update(ev)
        if self.tracker is not None:
            with timeline.span("log round", k):
                self.tracker.log_round(k + 1, metrics)

    def _dispatch(self, k: int, log: RoundLog) -> None:
        if not self.strategy.uses_clients:
            return  # a server-only method (Center) touches no client (Feddle spec I-13)
        d = self.schedule.dispatch(k)
        self._warn_unused_faults(k, set(d.clients.tolist()))
        if not len(d):
            return
        v = self._current_handle()
        downlink = self._timed(self.strategy.configure, k, d.clients.tolist())
        if downlink is not None and (downlink.tensors or downlink.per_client):
            self._publish_downlink(k, downlink, len(d))
            log.bytes_down += sum(downlink.nbytes(c) for c in d.clients.tolist())
        jobs = []
        n = len(d)
        lost, caps = d.lost, d.max_steps  # devices: jobs that will not arrive, step caps
        for j, client, t_arr, r_arr in zip(
            range(n),
            d.clients.tolist(),
            d.arrival_times.tolist(),
            d.arrival_rounds.tolist(),
            strict=True,
        ):
            self._job_ids += 1
            st = self.stats[client]
            st.dispatched += 1
            if lost is not None and lost[j]:
                st.dropped_device += 1
                continue
            v.refs += 1
            self.queue.push(PendingJob(client, k, self.version, t_arr, r_arr, self._job_ids))
            if r_arr < self.cfg.rounds:
                # partial work arrives in its round (devices.late drop), so no checkpoint holds
                # a capped job in flight for a resume to send again without its cap
                cap = int(caps[j]) if caps is not None and caps[j] >= 0 else None
                jobs.append(self._client_job(self._job_ids, client, k, cap))
                if self._jobs_wait:
                    self._waiting.append((jobs[-1], self.version, r_arr))
        log.bytes_down += len(d) * v.weights.nbytes
        if jobs and not self._jobs_wait:
            self._submissions[k] = [(j.job_id, j.client, k) for j in jobs]
            self.executor.submit(v.handle, jobs)

    def _client_job(
        self, job_id: int, client: int, dispatch_round: int, max_steps: int | None = None
    ) -> ClientJob:
        """The job a dispatched client runs: its stored personal state and its downlink
        (``max_steps``: partial work, the local steps its device has time for)."""
        state = self._state_for_job(job_id, client)
        b = self._broadcasts.get(dispatch_round)
        if b is None:
            return ClientJob(
                job_id,
                client,
                dispatch_round,
                self.cfg.seed,
                state,
                store=self._job_store(),
                max_steps=max_steps,
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
            max_steps=max_steps,
        )

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
        self._job_done(job.job_id)
        self._release_broadcast(job.dispatch_round)
        log.compute_s[result.worker_pid] += result.seconds
        st = self.stats[job.client]
        extras = sum(a.nbytes for a in result.extras.values())
        log.bytes_up += result.delta_nbytes + extras
        log.bytes_in += extras  # what reached this process: the extras, and a delta sent whole
        if isinstance(result.delta, np.ndarray):
            log.bytes_in += result.delta.nbytes
        if not result.is_finite():
            self._drop_state(result.state)  # the version it saved is never adopted
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
            self._adopt_state(job.client, result.state)
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
        m = self._round_report(k, log, wall)
        if evaluating:
            # eval.clients: N scores the first N clients to have personal state: only theirs
            # are read (not a copy of 10^6 clients' entries each round)
            n, final = self.cfg.eval.clients, self.done
            states = dict(islice(self.client_states.items(), n) if n else self.client_states)
            self._read_for_evaluation(states.values())
            if v is not None:
                self._pending = (k, m, self.evaluator.submit(v.weights, states, final, k, v.handle))
            else:
                weights = self.strategy.weights
                self._pending = (k, m, lambda: self.evaluator(weights, states, final, k))
        return m
