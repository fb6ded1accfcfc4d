"""What travels between coordinator and workers: client jobs and their results."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

CLIENT_STREAM = 0xC11E
EVAL_STREAM = 0xE7A1
#: a round's metric, 1.0 on the last round of a run its strategy ended early (a privacy budget
#: spent): the driver's loop ends on it
STOPPED_EARLY = "stopped_early"


def client_seed(seed: int, client: int, dispatch_round: int) -> int:
    """The RNG seed of one client job, derived from (run seed, client id, dispatch round) only."""
    ss = np.random.SeedSequence([seed, CLIENT_STREAM, client, dispatch_round])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def group_count(n: int, size: int) -> int:
    """How many groups ``n`` jobs train in, at most ``size`` each: the fewest that hold them,
    raised to a power of two, so that a pool of 1, 2, 4, 8 ... workers gets equal shares (40
    jobs in groups of at most 16: 4 of 10, 20 each on two workers, not 16 + 16 + 8)."""
    if n <= 0:
        return 0
    fewest = -(-n // size)
    return min(n, 1 << (fewest - 1).bit_length())


def job_groups(jobs: list[T], size: int) -> list[list[T]]:
    """A submission's jobs cut, in schedule order, into the groups that train together:
    ``group_count`` groups of sizes that differ by one at most (the larger first). Fixed by the
    schedule, never by the pool, so a client's result does not depend on how many workers there
    are (a batched pass's last bits depend on who trains beside whom)."""
    g = group_count(len(jobs), size)
    if g == 0:
        return []
    q, r = divmod(len(jobs), g)
    bounds = [i * q + min(i, r) for i in range(g + 1)]
    return [jobs[bounds[i] : bounds[i + 1]] for i in range(g)]


def one_or_each(handles: list[Any]) -> Any:
    """The versions a submission's jobs start from, as ``Executor.submit`` takes them: one
    handle where every job has the same (the same object), else the list, one per job."""
    first = handles[0]
    return first if all(h is first for h in handles) else handles


@dataclass(frozen=True)
class LeftOnNode:
    """A result's delta as a worker sends it with ``workers.partial_sums``: the array went out as
    an object of its own, kept on the worker's node; the pool puts a ``HeldDelta`` in its place."""

    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class ClientJob:
    """One virtual client's local training on a given global model version."""

    job_id: int
    client: int
    dispatch_round: int
    run_seed: int
    #: the client's personal state (None: first visit): its arrays, or a handle the executor
    #: resolves on the worker (a Ray object ref), so large states never pass the coordinator
    state: Any = None
    downlink: Any = None  # handle of the round's broadcast tensors (``Executor.put``), or None
    own: dict[str, np.ndarray] | None = None  # tensors for this client only
    #: ``clients.state.store: disk``: the store the job's new state is written to
    store: str | None = None
    #: devices' partial work: at most this many local steps (None: the job's full work)
    max_steps: int | None = None

    @cached_property
    def seed(self) -> int:
        """Derived on the worker, so the coordinator's hot loop does not pay for it (once a
        job: a worker asks for it three times)."""
        return client_seed(self.run_seed, self.client, self.dispatch_round)


@dataclass
class ClientResult:
    job_id: int
    client: int
    #: the update: an array, or where the pool keeps it on the worker's node
    #: (``workers.partial_sums``) a ``HeldDelta``
    delta: Any
    num_samples: int
    metrics: dict[str, float] = field(default_factory=dict)
    #: new personal state ({} = none): arrays, or a handle to them (``Executor.get``)
    state: Any = field(default_factory=dict)
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # side channel up
    worker_pid: int = 0  # the process that ran the job (a change means the worker restarted)
    #: the worker's wall seconds for this job (a group's time split evenly); a timing, never a
    #: metric: it feeds the round's ``round_compute_s`` only
    seconds: float = 0.0
    #: whether every value of the delta is finite, as the worker found (None: not looked)
    finite: bool | None = None
    #: the node of the worker that ran the job ("" in process)
    node: str = ""

    @property
    def delta_nbytes(self) -> int:
        return int(self.delta.nbytes)

    def is_finite(self) -> bool:
        """The worker's finding, or a look at the delta where it made none."""
        if self.finite is None:
            self.finite = bool(np.isfinite(self.delta).all())
        return self.finite


@dataclass(frozen=True)
class EvalJob:
    """Score one view of a model version on named evaluation sets (``{set: metrics}`` back).

    ``client=None`` is the global model as built around the global vector (personal groups at
    their built values). For a client, ``group`` is the parameter group forward passes apply
    (``Method.evaluate_with``), ``state`` its personal state, and ``adapt`` runs the method's
    ``ClientAlgorithm.adapt`` on the client's data first (seeded by ``eval_seed``).
    ``generate`` adds ROUGE-1 by greedy decoding on text sets.
    """

    job_id: int
    sets: tuple[str, ...]
    client: int | None = None
    group: str = "global"
    state: Any = None  # as ``ClientJob.state``
    adapt: bool = False
    generate: bool = True
    run_seed: int = 0
    round: int = 0

    @property
    def seed(self) -> int:
        """The seed of ``adapt``: its own stream, apart from every training job's."""
        ss = np.random.SeedSequence([self.run_seed, EVAL_STREAM, self.client or 0, self.round])
        return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
