"""``CoordinatorCore``'s clients' personal states: simulated client storage.

A client's personal state is the one its last accepted job handed back: arrays, an executor's
handle to them, or with ``clients.state.store: disk`` a ``StoredState`` (a file of the run's
store, ``raysim.state.store``). The strategy never sees it; the client's next job and the
evaluations read it. Each stored version has holders: the job it was sent with and a pending
evaluation (counted), the newest durable checkpoint (a set), the client whose current version
it is. A version that has none left is deleted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from raysim.actors.executor import Executor
from raysim.config import RunConfig
from raysim.state.store import StoredState, load_entry, open_store, run_folder, store_at


class ClientStates:
    """The part of ``CoordinatorCore`` that holds ``client_states`` (by client), the store they
    are written to (``state_root``) and who still reads each stored version."""

    # the core's, used here
    cfg: RunConfig
    executor: Executor

    def _init_client_states(self, cfg: RunConfig, state_root: str | None) -> None:
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

    # ----------------------------------------------------------------- readers
    def _state_for_job(self, job_id: int, client: int) -> Any:
        """The personal state a job of ``client`` starts from (read by it until it arrives)."""
        state = self.client_states.get(client)
        if isinstance(state, StoredState):
            self._readers[state] += 1
            self._job_states[job_id] = state
        return state

    def _job_done(self, job_id: int) -> None:
        """The job's worker is done with the version it was sent."""
        read = self._job_states.pop(job_id, None)
        if read is not None:
            self._unread(read)

    def _read_for_evaluation(self, states: Iterable[Any]) -> None:
        """The stored ones among ``states`` are read by the evaluation until it settles."""
        self._eval_states = [s for s in states if isinstance(s, StoredState)]
        for stored in self._eval_states:
            self._readers[stored] += 1

    def _evaluation_read(self) -> None:
        """The pending evaluation has read its states."""
        read, self._eval_states = self._eval_states, []
        for stored in read:
            self._unread(stored)

    def _adopt_state(self, client: int, state: Any) -> None:
        """``client``'s new personal state, handed back by its accepted job."""
        old = self.client_states.get(client)
        self.client_states[client] = state
        if isinstance(old, StoredState) and old != state:
            self._collect(old)

    def _drop_state(self, state: Any) -> None:
        """A state handed back with a rejected update: never adopted."""
        if isinstance(state, StoredState):
            self._collect(state)

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

    # ----------------------------------------------------------------- as arrays
    def materialized_states(self) -> dict[int, dict[str, np.ndarray]]:
        """Every client's personal state as arrays (``client_states`` may hold references); a
        state on disk stays its ``StoredState`` (a checkpoint refers to the file)."""
        out = {}
        for j, st in self.client_states.items():
            value = self.executor.get(st)
            out[j] = value if isinstance(value, StoredState) else dict(value)
        return out

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
