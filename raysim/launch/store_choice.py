"""``clients.state.store: auto``, decided once by the plan (``plan_run``): memory, or disk where
the personal state of the clients a run can visit would take more than a share of this machine's
memory (``raysim.launch.sizes`` estimates it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from raysim.config import RunConfig, with_state_store
from raysim.launch import sizes
from raysim.launch.sizes import StoreChoice, _count, human, keeps_personal_state, personal_state

#: ``clients.state.store: auto`` keeps clients' personal state in memory up to this share of the
#: machine's total memory and on disk above it. The memory store keeps it in Ray's object store,
#: which Ray sizes to 30% of memory and spills to disk beyond, slower than the disk store (3,000
#: clients of 8 MiB, 23.4 GiB, on a 23 GiB machine: 304 s at a 23.4 GB peak in memory, 150 s at
#: 1.8 GB on disk); a quarter leaves the rest of the run (models, updates, a checkpoint, Ray and
#: torch themselves) its room. Held to the total, the figure the plan prints, not to what is
#: available at the moment, so that a dry run and its run decide alike.
AUTO_DISK_SHARE = 0.25


def choose_store(
    cfg: RunConfig, here: bool = True, keeps_state: Callable[[], bool] | None = None
) -> tuple[RunConfig, StoreChoice | None]:
    """``clients.state.store: auto`` decided, once, by the plan (``plan_run``): ``cfg`` with
    ``memory`` or ``disk`` in its place, so that nothing after the plan sees ``auto``, and how it
    was decided; ``cfg`` itself and None for an explicit store.

    Disk where the personal state of the clients the run can visit (``personal_state``: the
    estimate's own term, V × 4P) exceeds ``AUTO_DISK_SHARE`` of this machine's memory and the
    method keeps some (``keeps_state``, asked only there); else memory. Memory, with the reason,
    also where the store's folder cannot be chosen here: a run not ``here`` (a named cluster,
    whose memory is not checked here) or on a Ray of several nodes (a store on disk needs a
    ``clients.state.dir`` every node mounts, which only the user can name), and a
    ``clients.state.dir`` where a resume would not find the store (a Ray job's temporary
    working_dir) or that cannot be written."""
    if cfg.clients.state.store != "auto":
        return cfg, None
    keeps_state = keeps_state or (lambda: keeps_personal_state(cfg))
    store, why, shown = _auto_store(cfg, here, keeps_state)
    return with_state_store(cfg, store), StoreChoice(store, why, shown)


#: what a line that chose memory says to keep the states on disk instead
TO_DISK = "clients.state.store=disk puts them on disk"


def _auto_store(
    cfg: RunConfig, here: bool, keeps_state: Callable[[], bool]
) -> tuple[str, str, bool]:
    """``choose_store``'s decision: the store, why, and whether the plan says so."""
    known = sizes.plugin_method(cfg)
    shared = f"{TO_DISK}, in a clients.state.dir every node mounts"
    if not here:
        return "memory", f"on the cluster, whose memory is not checked here: {shared}", known
    model = sizes.model_size(cfg)
    states = personal_state(cfg, model).nbytes
    if model is None and not states:
        return "memory", f"their size is unknown before the model is built: {TO_DISK}", known
    whole, v = sizes.memory()[0], sizes.visited(cfg)
    size = f"{_count(v)} clients × {human(states // max(v, 1))} = {human(states)}"
    limit = f"{AUTO_DISK_SHARE:.0%} of this machine's {human(whole)} of memory"
    if states <= AUTO_DISK_SHARE * whole:
        return "memory", f"{size}, within {limit}; {TO_DISK}", known
    if not keeps_state():
        return "memory", "the method keeps no personal state", False
    nodes = _ray_nodes()
    if nodes > 1:  # a store on disk needs a folder every node mounts: only the user knows one
        return "memory", f"{size}, above {limit}, but on a Ray of {nodes} nodes: {shared}", True
    unusable = _unusable_dir(cfg.clients.state.dir)
    if unusable:
        return "memory", f"{size}, above {limit}, but {unusable}", True
    return "disk", f"{size}, above {limit}; clients.state.store=memory keeps them there", True


def _ray_nodes() -> int:
    """The live nodes of the Ray this process has joined already (a Tune trial's); 1 without."""
    from raysim.launch.without_ray import ray_is_up

    if not ray_is_up():
        return 1
    import ray

    return max(1, sum(1 for n in ray.nodes() if n.get("Alive")))


def _unusable_dir(folder: str) -> str:
    """Why ``clients.state.dir`` cannot hold a store that outlives the run, the fix included;
    "" where it can (``raysim.launch.placement.check_state_outlives_job`` refuses the first for
    an explicit ``disk``)."""
    from raysim.launch.placement import job_working_dir

    work = job_working_dir()
    if work is not None and Path(folder).resolve().is_relative_to(work):
        return (
            f"clients.state.dir={folder} is in this Ray job's temporary working_dir ({work}), "
            "where they would vanish with the job: set clients.state.dir to a folder outside it"
        )
    found = sizes.existing(folder)
    if not os.access(found, os.W_OK | os.X_OK):
        return f"clients.state.dir={folder} cannot be written ({found}): set one that can"
    return ""
