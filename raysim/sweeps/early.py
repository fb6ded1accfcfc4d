"""A Tune trial's workers, started as soon as its process loads the trainable's module.

Before any of a trial's own code runs, Tune starts the trial's process and imports ``ray.tune``
in it (about 1 s on 2 vCPUs, ``benchmarks/RESULTS.md``); the trial would then start its
workers, whose own start-up (a process, torch) is the longest step to its first round. A plain
``raysim run`` starts its workers first thing. So ``raysim.sweeps.trial`` calls ``start`` before
it imports ``ray.tune``: where this process is a trial's (it runs in a placement group of this
Ray job) and the sweep published its workers' launch (``publish``), the workers start in the
trial's placement group at once. The trial's run takes them (``take``) where its own launch is
the same, and otherwise ends them and starts its own. Workers take their config with their first
call (``Worker``), so they start before the trial's config is known. They belong to this process
and end with it (Tune may end a trial's process before its first step).
"""

from __future__ import annotations

import pickle
from typing import Any

NAMESPACE = "raysim"
#: the workers this process started, and the launch they came from; None: not looked yet
_started: tuple[Any, list[Any]] | None = None


def _key() -> bytes:
    import ray

    return f"early-workers/{ray.get_runtime_context().get_job_id()}".encode()


def publish(launch: Any | None) -> None:
    """Make ``launch`` (a ``WorkerLaunch``; None: none) what this job's trials start early."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    if launch is None:
        _internal_kv_del(_key(), namespace=NAMESPACE)
    else:
        _internal_kv_put(_key(), pickle.dumps(launch), overwrite=True, namespace=NAMESPACE)


def start() -> None:
    """Start the published workers, once per process, where this process runs in a placement
    group (a trial's); elsewhere nothing."""
    global _started
    if _started is not None:
        return
    _started = (None, [])
    import ray

    if not ray.is_initialized():
        return
    from ray.experimental.internal_kv import _internal_kv_get
    from ray.util import get_current_placement_group

    if get_current_placement_group() is None:
        return
    spec = _internal_kv_get(_key(), namespace=NAMESPACE)
    if spec is None:
        return
    launch = pickle.loads(spec)
    _started = (launch, [launch.start() for _ in range(launch.count)])


def stand_down() -> None:
    """This process starts no workers (``start``): it is a worker itself, which runs in its
    trial's placement group too, and would load this module wherever it read the trial's actor
    handle without the stand-in class a link gives it (``raysim.actors.compiled``)."""
    global _started
    if _started is None:
        _started = (None, [])


def take(launch: Any | None) -> list[Any]:
    """The workers ``start`` started, where they came from ``launch`` (each is taken once);
    others are ended (all of them for None: the run starts no worker actor), and the caller
    starts its own."""
    global _started
    started, handles = _started or (None, [])
    _started = (None, [])
    if started == launch:
        return handles
    import ray

    for handle in handles:
        ray.kill(handle, no_restart=True)
    return []
