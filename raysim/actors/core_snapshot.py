"""What a checkpoint holds of ``CoordinatorCore`` (``state_dict``) and how a freshly built core
takes it back (``load_state_dict``), restarting the jobs that were in flight.

``raysim/state/checkpoint.py`` writes the dict as files; its keys, their order and their values'
layout are the checkpoint format (``state.json``, ``arrays.safetensors``).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from raysim.actors.core_report import ClientStats
from raysim.actors.core_versions import _Broadcast, _Version
from raysim.actors.executor import Executor
from raysim.actors.jobs import ClientJob, job_groups, one_or_each
from raysim.algorithms.base import Downlink, Strategy
from raysim.config import RunConfig
from raysim.sim.clock import ArrivalQueue, PendingJob, Schedule
from raysim.state.store import StateStoreError, StoredState


class Snapshot:
    """The part of ``CoordinatorCore`` that saves and restores the whole of it."""

    # the core's, used here
    cfg: RunConfig
    executor: Executor
    evaluator: Any
    strategy: Strategy
    schedule: Schedule
    queue: ArrivalQueue
    round: int
    version: int
    stats: dict[int, ClientStats]
    client_states: dict[int, Any]
    state_root: str | None
    history: list[dict[str, float]]
    evaluations: list[dict[str, float]]
    totals: defaultdict[str, float]
    _started: float
    _job_ids: int
    _submissions: dict[int, list[tuple[int, int, int]]]
    _waiting: list[tuple[ClientJob, int, int]]
    _versions: dict[int, _Version]
    _broadcasts: dict[int, _Broadcast]
    _checkpointed: set[StoredState]
    settle: Callable[[], None]
    stored_states: Callable[[], set[StoredState]]
    materialized_states: Callable[[], dict[int, Any]]
    _publish: Callable[..., _Version]
    _client_job: Callable[[int, int, int], ClientJob]

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
    count = len(cols["client"])
    zero = ClientStats()  # a counter added since the checkpoint was written starts at its default
    rows = zip(
        *(cols[n].tolist() if n in cols else [getattr(zero, n)] * count for n in names),
        strict=True,
    )
    return {c: ClientStats(*row) for c, row in zip(cols["client"].tolist(), rows, strict=True)}
