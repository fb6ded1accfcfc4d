"""What ``CoordinatorCore`` reports: each round's metrics, the final metrics, the per-client
table (``clients.csv``, ``Result.clients``) and the final weights' digest."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raysim.actors.executor import Executor
from raysim.algorithms.base import Strategy
from raysim.config import RunConfig
from raysim.sim.build import weights_digest
from raysim.sim.clock import ArrivalQueue
from raysim.state.store import load_entry

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
    "dropped_device",
    "mean_train_loss",
    "mean_staleness_rounds",
    "last_round",
)

#: Per-round metrics that measure wall-clock time: they differ between two runs of one config,
#: every other metric does not (docs/execution.md, "What deterministic promises").
TIMING_METRICS = frozenset(
    {"wall_time", "round_wall_s", "round_wait_s", "round_compute_s", "round_compute_min_s"}
    | {"server_wall_s", "audit_wall_s", "reduce_wall_s"}
)


@dataclass(slots=True)
class ClientStats:
    """Per-client counters for the per-client metrics table (kept for clients that were
    dispatched only: a population of 10^6 that a run visits 2,000 times holds 2,000)."""

    dispatched: int = 0
    arrived: int = 0
    rejected: int = 0
    dropped_late: int = 0
    #: devices: dispatched but lost (its device left, it was a dropped straggler, or its round
    #: closed before it was done)
    dropped_device: int = 0
    num_samples: int = 0
    train_loss_sum: float = 0.0
    staleness_sum: int = 0
    last_round: int = -1


@dataclass
class RoundLog:
    """Accumulates what happens inside one round."""

    arrived: int = 0
    rejected: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    #: bytes of updates that reached the coordinator's process: whole ones, partial sums
    bytes_in: int = 0
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


class RunReport:
    """The part of ``CoordinatorCore`` that turns what the run counted (``stats``, ``totals``,
    ``history``, ``evaluations``) into its metrics and tables."""

    # the core's, used here
    cfg: RunConfig
    executor: Executor
    strategy: Strategy
    evaluator: Any
    auditor: Any
    queue: ArrivalQueue
    client_sizes: np.ndarray
    round: int
    version: int
    stats: dict[int, ClientStats]
    totals: defaultdict[str, float]
    evaluations: list[dict[str, float]]
    _started: float
    warn: Callable[[str], None]
    settle: Callable[[], None]
    materialized_states: Callable[[], dict[int, Any]]

    def _round_report(self, k: int, log: RoundLog, wall: float) -> dict[str, float]:
        """Round ``k``'s metrics (its evaluation apart), its counts added to ``totals``."""
        summed, reduce_s = self.executor.sum_counts()
        log.bytes_in += summed
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
            # the least busy worker's, of those that ran jobs: how even the round's shares were
            "round_compute_min_s": min(log.compute_s.values(), default=0.0),
            "server_wall_s": log.server_s,
            "clients_arrived": float(log.arrived),
            "clients_in_flight": float(len(self.queue)),
            "rejected_updates": float(log.rejected),
            "rejected_updates_total": self.totals["rejected_updates"],
            "bytes_up": float(log.bytes_up),
            "bytes_down": float(log.bytes_down),
            "coordinator_bytes_in": float(log.bytes_in),
            "model_version": float(self.version),
        }
        m.update(self.schedule.last)  # devices: the round's virtual seconds, jobs lost
        if reduce_s:  # the busiest node's reducer: its sums ran in parallel with the others'
            m["reduce_wall_s"] = max(reduce_s.values())
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
        return m

    # ----------------------------------------------------------------- the run's end
    @property
    def weights(self) -> np.ndarray:
        return self.strategy.weights

    def digest(self) -> str:
        return weights_digest(self.strategy.weights)

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
        last = self.history[-1] if self.history else {}
        if "dp_epsilon" in last or "dp_sgd_epsilon" in last:  # privacy: what the run spent
            out.update({k: v for k, v in self.history[-1].items() if k.startswith("dp_")})
        if self.strategy.stop_reason is not None and self.round < self.cfg.rounds:
            out["stopped_early"] = 1.0
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
                "dropped_device": s.dropped_device,
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
