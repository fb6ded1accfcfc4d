"""What travels between coordinator and workers: client jobs and their results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

CLIENT_STREAM = 0xC11E


def client_seed(seed: int, client: int, dispatch_round: int) -> int:
    """The RNG seed of one client job, derived from (run seed, client id, dispatch round) only."""
    ss = np.random.SeedSequence([seed, CLIENT_STREAM, client, dispatch_round])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class ClientJob:
    """One virtual client's local training on a given global model version."""

    job_id: int
    client: int
    dispatch_round: int
    run_seed: int
    state: dict[str, np.ndarray] | None = None  # the client's personal state (None: first visit)
    downlink: Any = None  # handle of the round's broadcast tensors (``Executor.put``), or None
    own: dict[str, np.ndarray] | None = None  # tensors for this client only

    @property
    def seed(self) -> int:
        """Derived on the worker, so the coordinator's hot loop does not pay for it."""
        return client_seed(self.run_seed, self.client, self.dispatch_round)


@dataclass
class ClientResult:
    job_id: int
    client: int
    delta: np.ndarray
    num_samples: int
    metrics: dict[str, float] = field(default_factory=dict)
    state: dict[str, np.ndarray] = field(default_factory=dict)  # new personal state
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # side channel up


@dataclass(frozen=True)
class EvalJob:
    """Evaluate one adapter of the resident model on one of the dataset's evaluation sets.

    ``adapter`` "global" uses the global vector alone; "personal" also loads ``state`` (a client's
    personal state) and evaluates the personal adapter. ``generate`` adds ROUGE-1 by greedy
    decoding to the teacher-forced loss.
    """

    job_id: int
    eval_set: str
    adapter: str = "global"
    client: int | None = None
    state: dict[str, np.ndarray] | None = None
    generate: bool = True
