"""Personal state on disk: a client's entry (its model's personal parameters and its
``ClientContext.state``) as one safetensors file per version, so that neither the coordinator
nor the workers hold the population's state in memory (issue 43).

A worker writes a client's entry when its job ends and hands back a ``StoredState`` (a few
bytes: the file's name and size); the coordinator keeps those, checkpoints refer to them, and the
next job's worker reads the file. Each version has a file of its own (``<client>-<job>``), never
rewritten: a checkpoint's versions stay readable after later rounds, so a resume is bit-identical,
and a crash in the middle of a write leaves the previous version whole (the new file is written
beside and renamed into place). The coordinator deletes a version once nothing can read it
(``CoordinatorCore``'s holders). Files sit in folders of 1,000 clients.

Where a run has several nodes, the directory must be one they all mount (NFS, a shared volume).
The coordinator marks the store it makes (``STORE.json``); a process that finds no mark where
the store should be (a worker on another node, whose disk does not have it) stops the run in one
line instead of writing a store of its own.

A client's state is its own: the store's folders are made 0700 and its files 0600, whatever the
umask (``raysim.util.private_files``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysim.util.private_files import private_dir, private_temp, write_private

#: clients per folder of the store
SHARD = 1000
#: the file that marks a run's store, written by its coordinator
MARKER = "STORE.json"


class StateStoreError(RuntimeError):
    """A stored state cannot be read: its file (or the whole store) is gone."""


@dataclass(frozen=True)
class StoredState:
    """A client's entry in a ``DiskStateStore``: the store, the version, its size."""

    root: str
    client: int
    job: int
    nbytes: int

    @property
    def name(self) -> str:
        return f"{self.client // SHARD:04d}/{self.client}-{self.job}.safetensors"


_STORES: dict[str, DiskStateStore] = {}


def run_folder(parent: str, name: str | None = None) -> str:
    """A run's store: the folder ``name`` (default: a fresh unique one) inside ``parent``
    (``clients.state.dir``), as an absolute path every process of the run reads alike."""
    import uuid

    return str(Path(parent).resolve() / (name or uuid.uuid4().hex))


def open_store(root: str) -> DiskStateStore:
    """The run's store, made (and marked) by its coordinator if it is not there yet."""
    marker = Path(root) / MARKER
    if not marker.is_file():  # the store's folder (and missing parents) 0700, the mark 0600
        mark = {"made_on": socket.gethostname(), "pid": os.getpid()}
        write_private(marker, json.dumps(mark).encode())
    return store_at(root)


def store_at(root: str) -> DiskStateStore:
    """This process's ``DiskStateStore`` of ``root`` (one cache per store and process); the
    first call in a process checks that the store is there (``open_store`` marked it)."""
    store = _STORES.get(root)
    if store is None:
        if not (Path(root) / MARKER).is_file():
            raise StateStoreError(
                f"the run's personal-state store {root} is not on this node "
                f"({socket.gethostname()}): clients.state.dir must be a folder every node of "
                "the cluster mounts (NFS, a shared volume), or set clients.state.store=memory "
                "(if the folder was shared, it has been deleted)"
            )
        store = _STORES[root] = DiskStateStore(root)
    return store


def load_entry(stored: object) -> object:
    """A job's stored state as the worker uses it: a ``StoredState`` read from its store, any
    other value (arrays, None) as it is."""
    return store_at(stored.root).load(stored) if isinstance(stored, StoredState) else stored


class DiskStateStore:
    """Clients' entries as files under ``root``; a bounded cache of the entries last read."""

    def __init__(self, root: str | os.PathLike, cache_bytes: int = 64 << 20) -> None:
        self.root = Path(root)
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[StoredState, dict[str, np.ndarray]] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()

    def save(self, client: int, job: int, entry: Mapping[str, np.ndarray]) -> StoredState:
        """Write ``entry`` as version ``job`` of ``client``: to a unique 0600 temporary file,
        flushed to disk, then renamed into place (a crash leaves either no new version or a whole
        one); its folder is made 0700."""
        from safetensors.numpy import save

        # np.require, not ascontiguousarray: that one makes a 0-d array 1-d
        arrays = {k: np.require(v, requirements="C") for k, v in entry.items()}
        data = save(arrays)
        token = StoredState(str(self.root), client, job, len(data))
        path = self.root / token.name
        # not write_private: its folder fsync per file makes a save 10-50 % slower (measured),
        # and this store writes a file per client and round; the file's own fsync stays
        with private_temp(private_dir(path.parent), prefix=f".{path.name}.") as (f, tmp):
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
        return token

    def load(self, token: StoredState) -> dict[str, np.ndarray]:
        """The entry ``token`` names (read-only arrays; a recent one from the cache)."""
        from safetensors.numpy import load

        with self._lock:
            hit = self._cache.get(token)
            if hit is not None:
                self._cache.move_to_end(token)
                return hit
        path = self.root / token.name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            where = "the store is gone" if not self.root.is_dir() else "its file is gone"
            raise StateStoreError(
                f"client {token.client}'s personal state cannot be read: {where} ({path}); "
                "a store must outlive its run and every checkpoint it is resumed from"
            ) from None
        entry = load(data)
        for value in entry.values():
            value.flags.writeable = False
        with self._lock:
            if token.nbytes <= self.cache_bytes:
                self._cache[token] = entry
                self._cached += token.nbytes
                while self._cached > self.cache_bytes:
                    old, _ = self._cache.popitem(last=False)
                    self._cached -= old.nbytes
        return entry

    def delete(self, token: StoredState) -> None:
        """Remove a version nothing reads any more (missing already: nothing to do)."""
        with self._lock:
            if self._cache.pop(token, None) is not None:
                self._cached -= token.nbytes
        (self.root / token.name).unlink(missing_ok=True)

    def files(self) -> int:
        """How many versions the store holds (for tests and reports)."""
        return sum(1 for _ in self.root.glob("*/*.safetensors"))
