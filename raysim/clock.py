"""The virtual clock: a method-independent dispatch schedule and an arrival queue (feddle.md §2.3).

Time is measured in rounds; round k is [k, k+1). At the start of round k, ``min(S, #idle)`` idle
clients are drawn uniformly without replacement; each gets a fresh delay d and is delivered in round
``⌊k + d⌋`` (rounding configurable), after which it is idle again from the next round. Nothing here
sleeps and nothing depends on the aggregation method or on real completion order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from raysim.delays import DelayModel

SCHEDULE_STREAM = 0x5C4E


@dataclass(frozen=True)
class Dispatches:
    """One round's dispatches, as parallel arrays in sampled order."""

    round: int
    clients: np.ndarray
    delays: np.ndarray
    arrival_times: np.ndarray
    arrival_rounds: np.ndarray

    def __len__(self) -> int:
        return len(self.clients)


class Schedule:
    """Generates dispatches round by round from its own RNG stream ``(seed, SCHEDULE_STREAM)``."""

    def __init__(self, num_clients: int, per_round: int, delay_model: DelayModel, seed: int):
        if per_round < 1 or num_clients < 1:
            raise ValueError("need at least one client and one client per round")
        self.num_clients = num_clients
        self.per_round = per_round
        self.delay_model = delay_model
        self.rng = np.random.default_rng([seed, SCHEDULE_STREAM])
        self.busy_until = np.zeros(num_clients, dtype=np.int64)  # idle when busy_until <= k
        self.next_round = 0

    def dispatch(self, k: int) -> Dispatches:
        """Dispatches of round ``k``; rounds must be requested in order 0, 1, 2, …"""
        if k != self.next_round:
            raise ValueError(f"schedule asked for round {k}, expected {self.next_round}")
        self.next_round += 1
        idle = np.flatnonzero(self.busy_until <= k)
        size = min(self.per_round, len(idle))
        chosen = self.rng.choice(idle, size=size, replace=False) if size else idle[:0]
        delays = self.delay_model.sample(self.rng, chosen)
        arrival_rounds = self.delay_model.delivery_round(k, delays)
        self.busy_until[chosen] = arrival_rounds + 1
        return Dispatches(k, chosen, delays, k + delays, arrival_rounds)

    def state_dict(self) -> dict[str, Any]:
        """RNG position, busy clients, next round and the delay model's state (for checkpoints)."""
        return {
            "rng": self.rng.bit_generator.state,
            "busy_until": self.busy_until.copy(),
            "next_round": self.next_round,
            "delay_model": self.delay_model.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        busy = np.asarray(state["busy_until"], dtype=np.int64)
        if busy.shape != (self.num_clients,):
            raise ValueError(f"schedule state is for {len(busy)} clients, not {self.num_clients}")
        self.rng.bit_generator.state = state["rng"]
        self.busy_until = busy.copy()
        self.next_round = int(state["next_round"])
        self.delay_model.load_state_dict(state["delay_model"])

    def in_flight(self, k: int) -> int:
        """Clients dispatched and not yet delivered before the end of round ``k``'s dispatch."""
        return int(np.count_nonzero(self.busy_until > k))


@dataclass(frozen=True)
class PendingJob:
    """A dispatched client job waiting for its virtual arrival."""

    client: int
    dispatch_round: int
    dispatch_version: int
    arrival_time: float
    arrival_round: int
    job_id: int


class ArrivalQueue:
    """Holds dispatched jobs until the clock reaches their delivery round."""

    def __init__(self) -> None:
        self._by_round: dict[int, list[PendingJob]] = defaultdict(list)
        self._count = 0

    def push(self, job: PendingJob) -> None:
        self._by_round[job.arrival_round].append(job)
        self._count += 1

    def pop_round(self, k: int) -> list[PendingJob]:
        """Jobs delivered in round ``k``, by increasing arrival time, ties by client id."""
        jobs = self._by_round.pop(k, [])
        self._count -= len(jobs)
        return sorted(jobs, key=lambda j: (j.arrival_time, j.client))

    def drop_after(self, last_round: int) -> list[PendingJob]:
        """Remove and return every job that would arrive after ``last_round`` (never delivered)."""
        late = [j for r in list(self._by_round) if r > last_round for j in self._by_round.pop(r)]
        self._count -= len(late)
        return late

    def jobs(self) -> list[PendingJob]:
        """Every job still waiting, in arrival-round order (then push order)."""
        return [j for r in sorted(self._by_round) for j in self._by_round[r]]

    def state_dict(self) -> list[dict[str, Any]]:
        return [asdict(j) for j in self.jobs()]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        self._by_round.clear()
        self._count = 0
        for job in state:
            self.push(PendingJob(**job))

    def __len__(self) -> int:
        return self._count
