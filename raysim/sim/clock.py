"""The virtual clock: a method-independent dispatch schedule and an arrival queue
(Feddle spec §2.3).

Time is measured in rounds; round k is [k, k+1). At the start of round k, ``min(S, #idle)`` idle
clients are drawn uniformly without replacement (or each idle one with probability S/N:
Poisson); each gets a fresh delay d and is delivered in round ``⌊k + d⌋`` (rounding
configurable), after which it is idle again from the next round. Nothing here sleeps and nothing
depends on the aggregation method or on real completion order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from raysim.sim.delays import DelayModel

SCHEDULE_STREAM = 0x5C4E


@dataclass(frozen=True)
class Dispatches:
    """One round's dispatches, as parallel arrays in sampled order."""

    round: int
    clients: np.ndarray
    delays: np.ndarray
    arrival_times: np.ndarray
    arrival_rounds: np.ndarray
    #: devices (``raysim.devices``): each job's step cap (-1: its full work) and why it will
    #: not arrive (0: it will); None on the round-counting clock
    max_steps: np.ndarray | None = None
    lost: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.clients)


class InFlight:
    """What every schedule keeps: its RNG stream ``(seed, SCHEDULE_STREAM)``, the clients in
    flight and the round from which each is idle again (never an array over the population),
    and the next round it will be asked for."""

    def __init__(self, num_clients: int, seed: int) -> None:
        self.num_clients = num_clients
        self.rng = np.random.default_rng([seed, SCHEDULE_STREAM])
        #: clients in flight, and the round from which each is idle again
        self.busy = np.zeros(0, dtype=np.int64)
        self.busy_until = np.zeros(0, dtype=np.int64)
        self.next_round = 0
        #: the last round's figures for its metrics (the device clock's; none here)
        self.last: dict[str, float] = {}

    def _begin(self, k: int) -> int:
        """Round ``k`` begins (rounds come in order 0, 1, 2, …): the clients idle again leave
        the busy list; returns how many clients are idle."""
        if k != self.next_round:
            raise ValueError(f"schedule asked for round {k}, expected {self.next_round}")
        self.next_round += 1
        still = self.busy_until > k
        self.busy, self.busy_until = self.busy[still], self.busy_until[still]
        return self.num_clients - len(self.busy)

    def _occupy(self, clients: np.ndarray, idle_from: np.ndarray) -> None:
        """``clients`` are busy until round ``idle_from`` (each)."""
        self.busy = np.concatenate([self.busy, clients])
        self.busy_until = np.concatenate([self.busy_until, idle_from])

    def _state(self) -> dict[str, Any]:
        order = np.argsort(self.busy)
        return {
            "rng": self.rng.bit_generator.state,
            "num_clients": self.num_clients,
            "busy": np.stack([self.busy[order], self.busy_until[order]], axis=1),
            "next_round": self.next_round,
        }

    def _load(self, n: int, busy: np.ndarray, state: dict[str, Any]) -> None:
        if n != self.num_clients:
            raise ValueError(f"schedule state is for {n} clients, not {self.num_clients}")
        busy = np.asarray(busy, dtype=np.int64).reshape(-1, 2)
        self.rng.bit_generator.state = state["rng"]
        self.busy, self.busy_until = busy[:, 0].copy(), busy[:, 1].copy()
        self.next_round = int(state["next_round"])

    def in_flight(self, k: int) -> int:
        """Clients dispatched and not yet delivered before the end of round ``k``'s dispatch."""
        return int(np.count_nonzero(self.busy_until > k))


class Schedule(InFlight):
    """Generates dispatches round by round from its own RNG stream ``(seed, SCHEDULE_STREAM)``.

    It keeps only the clients in flight (``in flight`` ≤ clients per round × the longest delay),
    never an array over the population: a round costs the same at 10^3 and 10^6 clients. Idle
    clients are drawn as ranks among the idle (``rng.choice(#idle)``) and mapped to client ids
    past the busy ones, the same draws as choosing from the array of idle ids."""

    def __init__(
        self,
        num_clients: int,
        per_round: int,
        delay_model: DelayModel,
        seed: int,
        sampling: str = "uniform",
    ):
        """``sampling``: ``uniform`` draws ``min(per_round, #idle)`` idle clients without
        replacement; ``poisson`` takes each idle client with probability per_round/num_clients
        (a binomial count, then that many drawn without replacement: the same distribution)."""
        if per_round < 1 or num_clients < 1:
            raise ValueError("need at least one client and one client per round")
        if sampling not in ("uniform", "poisson"):
            raise ValueError(f"sampling {sampling!r}: uniform or poisson")
        super().__init__(num_clients, seed)
        self.per_round = per_round
        self.sampling = sampling
        self.delay_model = delay_model

    def dispatch(self, k: int) -> Dispatches:
        """Dispatches of round ``k``; rounds must be requested in order 0, 1, 2, …"""
        idle = self._begin(k)
        if self.sampling == "poisson":
            size = int(self.rng.binomial(idle, self.per_round / self.num_clients))
        else:
            size = min(self.per_round, idle)
        ranks = self.rng.choice(idle, size=size, replace=False) if size else np.zeros(0, np.int64)
        chosen = idle_by_rank(ranks, np.sort(self.busy))
        delays = self.delay_model.sample(self.rng, chosen)
        arrival_rounds = self.delay_model.delivery_round(k, delays)
        self._occupy(chosen, arrival_rounds + 1)
        return Dispatches(k, chosen, delays, k + delays, arrival_rounds)

    def state_dict(self) -> dict[str, Any]:
        """RNG position, clients in flight, next round and the delay model's state."""
        return {**self._state(), "delay_model": self.delay_model.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "busy_until" in state:  # a checkpoint of an earlier version: one entry per client
            dense = np.asarray(state["busy_until"], dtype=np.int64)
            n, clients = len(dense), np.flatnonzero(dense)
            busy = np.stack([clients, dense[clients]], axis=1)
        else:
            n, busy = int(state["num_clients"]), np.asarray(state["busy"], dtype=np.int64)
        self._load(n, busy, state)
        self.delay_model.load_state_dict(state["delay_model"])


def idle_by_rank(ranks: np.ndarray, busy: np.ndarray) -> np.ndarray:
    """The client ids of ``ranks`` among the idle clients, ``busy`` being the sorted ids of the
    others: the ``r``-th idle id is ``r`` plus the busy ids before it (``busy[j] - j`` idle ids
    come before ``busy[j]``)."""
    before = busy - np.arange(len(busy), dtype=np.int64)
    return ranks.astype(np.int64) + np.searchsorted(before, ranks, side="right")


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
