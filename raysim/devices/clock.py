"""The virtual clock with devices (``devices.enabled``): rounds of at most ``deadline_s`` virtual
seconds, clients sampled among those available, each job's time from its device.

Round k starts at virtual second ``T_k`` (``T_0 = start_s``). It samples ``ceil(overcommit·S)``
of the idle clients that are available at ``T_k`` (candidates drawn uniformly among the idle, in
batches, until enough are found: O(clients sampled), never a pass over the population). Each
job then takes, on its device (FedScale's model, ``get_completion_time``):

    download + upload = 2·model_bytes·8/1000 / bandwidth_kbps seconds
    compute           = steps · backward_factor · batch_size · compute_ms / 1000 seconds

with ``steps`` its local optimizer steps (``training.settings.optimizer_steps``). A job is lost
when its device's availability window closes before it is done (the client left mid-round). A
job not done by the deadline either does the steps that fit (``partial_work: accept``, FedProx),
is lost (``drop``), or, with ``late: deliver``, runs to the end and arrives in the round its
completion falls in (asynchronous methods; rounds then all last ``deadline_s``). With
``close_after`` K, the round ends when its K-th job is done (by completion time, then client id)
or at the deadline; jobs done later are lost. ``T_{k+1}`` is the round's end.

Everything here is drawn from the schedule's own stream (``SCHEDULE_STREAM``) and the traces,
so the schedule is a function of the seed and the config alone: the same on any number of
workers and after a resume (``state_dict``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from raysim.sim.clock import Dispatches, InFlight, idle_by_rank

from .traces import DeviceTraces

#: why a dispatched job does not arrive (``DeviceDispatches.lost``)
LEFT, STRAGGLER, CLOSED = 1, 2, 3


@dataclass(frozen=True)
class DeviceDispatches(Dispatches):
    """A round's dispatches with devices (``lost``: ``LEFT``, ``STRAGGLER``, ``CLOSED``):
    ``seconds`` is each job's virtual duration, ``start`` and ``end`` the round's seconds."""

    seconds: np.ndarray | None = None
    start: float = 0.0
    end: float = 0.0


@dataclass(frozen=True)
class Work:
    """What a job costs its device: per client, the local steps of its full work, the samples of
    one step, and the bytes it moves (model down, update up)."""

    steps: np.ndarray
    batch_size: int
    model_bytes: int
    backward_factor: float = 3.0
    #: E, the local epochs of a full job (FedProx's stragglers do x < E of them)
    epochs: int = 1


class DeviceSchedule(InFlight):
    """``raysim.sim.clock.Schedule``'s interface on a clock of virtual seconds (module
    docstring). ``late``: ``drop`` or ``deliver``; ``partial``: accept partial work."""

    def __init__(
        self,
        traces: DeviceTraces,
        work: Work,
        per_round: int,
        seed: int,
        *,
        deadline_s: float,
        start_s: float = 0.0,
        overcommit: float = 1.0,
        close_after: int | None = None,
        partial: bool = False,
        min_steps: int = 1,
        late: str = "drop",
        availability: bool = True,
        stragglers: float = 0.0,
    ) -> None:
        super().__init__(len(work.steps), seed)
        self.traces, self.work = traces, work
        self.per_round = per_round
        self.sample_size = math.ceil(overcommit * per_round - 1e-9)
        self.close_after = close_after
        self.deadline = float(deadline_s)
        self.partial, self.min_steps, self.late = partial, min_steps, late
        self.availability = availability and not traces.always_available
        self.stragglers = stragglers
        self.time = float(start_s)

    # ----------------------------------------------------------------- sampling
    def _sample(self, idle: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``sample_size`` of the ``idle`` clients available at the round's start,
        uniformly among them (candidates drawn without replacement among the idle, in batches),
        and the second each one's availability window closes."""
        want = min(self.sample_size, idle)
        none = np.zeros(0, np.int64), np.zeros(0)
        if want == 0:
            return none
        busy = np.sort(self.busy)
        if not self.availability:
            clients = idle_by_rank(self.rng.choice(idle, size=want, replace=False), busy)
            return clients, np.full(want, math.inf)
        limit = min(idle, 64 * want)  # at most 64 candidates per client wanted
        if limit == idle:  # a small population: look at every idle client, in random order
            clients = idle_by_rank(self.rng.permutation(idle), busy)
            ok, until = self.traces.availability(clients, self.time)
            return clients[ok][:want], until[ok][:want]
        chosen: list[tuple[np.ndarray, np.ndarray]] = []
        seen: set[int] = set()
        found = drawn = 0
        while found < want and drawn < limit:
            m = min(max(8 * want, 256), limit - drawn)
            ranks = self.rng.choice(idle, size=m, replace=False)
            drawn += m
            fresh = [r for r in ranks.tolist() if r not in seen]
            seen.update(fresh)
            clients = idle_by_rank(np.array(fresh, dtype=np.int64), busy)
            ok, until = self.traces.availability(clients, self.time)
            chosen.append((clients[ok][: want - found], until[ok][: want - found]))
            found += len(chosen[-1][0])
        if not chosen:
            return none
        return np.concatenate([c for c, _ in chosen]), np.concatenate([u for _, u in chosen])

    def _straggling(self, full: np.ndarray) -> np.ndarray:
        """Each job's steps if it is one of FedProx's stragglers (Li et al. 2020, §5.2, and their
        code: ``round(n·(1-p))`` of the n sampled clients are drawn to do all E epochs, the
        others x ~ U{1..E-1} epochs, ``randint(1, E)``), else its full steps."""
        n = len(full)
        if not self.stragglers or not n:
            return full.copy()
        keep = round(n * (1 - self.stragglers))
        slow = np.ones(n, bool)
        slow[self.rng.choice(n, size=keep, replace=False)] = False
        epochs = max(self.work.epochs, 1)
        x = self.rng.integers(1, max(epochs - 1, 1), size=n, endpoint=True)
        part = np.maximum(full * x // epochs, 1)
        return np.where(slow, np.minimum(part, full), full)

    # ----------------------------------------------------------------- a round
    def dispatch(self, k: int) -> DeviceDispatches:
        """Round ``k``'s dispatches; rounds must be requested in order 0, 1, 2, …"""
        clients, until = self._sample(self._begin(k))
        t0, w = self.time, self.work
        e = self.traces.entries(clients)
        comm = 2 * w.model_bytes * 8 / 1000 / self.traces.bandwidth_kbps[e]
        step = w.backward_factor * w.batch_size * self.traces.compute_ms[e] / 1000
        full = w.steps[clients]
        seconds = comm + full * step
        max_steps = np.full(len(clients), -1, np.int64)
        lost = np.zeros(len(clients), np.int64)
        over = seconds > self.deadline
        budget = self._straggling(full)  # FedProx's stragglers: the steps they have time for
        over |= budget < full
        if self.late == "drop":
            if self.partial:
                fit = np.floor((self.deadline - comm) / step).astype(np.int64)
                fit = np.minimum(fit, budget)
                cut = over & (fit >= self.min_steps)
                max_steps[cut] = fit[cut]
                seconds = np.where(cut, comm + fit * step, seconds)
                lost[over & ~cut] = STRAGGLER
            else:
                lost[over] = STRAGGLER
        lost[(lost == 0) & (t0 + seconds > until)] = LEFT  # its device went offline first
        duration = self.deadline
        done = np.flatnonzero(lost == 0)
        if self.close_after is not None and len(done) >= self.close_after:
            order = done[np.lexsort((clients[done], seconds[done]))]
            closing = order[: self.close_after]
            duration = min(self.deadline, float(seconds[closing[-1]]))
            lost[order[self.close_after :]] = CLOSED
        if self.late == "deliver":
            arrival_times = k + seconds / self.deadline
            arrival_rounds = np.floor(arrival_times).astype(np.int64)
        else:
            arrival_times = k + np.minimum(seconds / duration if duration else 0.0, 1.0)
            arrival_rounds = np.full(len(clients), k, np.int64)
        delays = arrival_times - k
        # a lost job frees its client at the round's end; the others once delivered
        until_round = np.where(lost > 0, k, arrival_rounds) + 1
        self._occupy(clients, until_round)
        self.time = t0 + duration
        self.last = {
            "devices_sampled": float(len(clients)),
            "devices_partial": float(np.count_nonzero(max_steps >= 0)),
            "devices_left": float(np.count_nonzero(lost == LEFT)),
            "devices_stragglers_dropped": float(np.count_nonzero(lost == STRAGGLER)),
            "devices_stragglers": float(np.count_nonzero(budget < full)),
            "devices_closed_out": float(np.count_nonzero(lost == CLOSED)),
            "devices_round_s": float(duration),
            "devices_clock_s": float(self.time),
        }
        return DeviceDispatches(
            k, clients, delays, arrival_times, arrival_rounds,
            max_steps=max_steps, lost=lost, seconds=seconds, start=t0, end=self.time,
        )  # fmt: skip

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {**self._state(), "time": self.time}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load(int(state["num_clients"]), state["busy"], state)
        self.time = float(state["time"])
