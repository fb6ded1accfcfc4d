"""A worker's work through a Ray Compiled Graph instead of one actor call per batch.

An actor call costs about 1 ms on a 2-vCPU machine before any work, and its ~1 MB of results
another 2 ms through the object store. A compiled graph (``InputNode → Worker.serve``) keeps a
loop running on the worker that reads each request from a shared-memory channel and writes the
answer back to another: about 0.1 ms a request (``benchmarks/RESULTS.md``). The pool
(``raysim.actors.pool``) sends a worker's batches this way once its link is up, and through
plain calls otherwise; both run the same code on the worker and give the same results.

Each worker has its own graph, so a worker that dies breaks only its own link. Compiled graphs
reach only workers on this process's node (a channel to another node waits forever), and they
are built in a background thread while the first batches go by plain calls. In an actor (the
coordinator's, a Tune trial's) a graph starts no process of its own (``_proxy_is_this_actor``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import ray

#: longest pause between two looks at an answer that is not there yet (see ``WorkerLink.fetch``)
POLL_MAX_S = 5e-4

#: requests a link may hold unanswered; the pool reads the oldest before sending more. Each is a
#: shared-memory buffer per channel, kept as large as the largest message it carried.
MAX_IN_FLIGHT = 2


class WorkerLink:
    """A compiled graph from this process to one worker actor, built and warmed in a thread.

    ``ready`` is false until a first (empty) request came back; ``failed`` says why a link will
    never be ready (the worker is on another node, Ray refused the graph)."""

    def __init__(self, handle: Any, node_id: str) -> None:
        for name in ("ray.dag", "ray.experimental.channel"):  # "Tearing down compiled DAG", ...
            logging.getLogger(name).setLevel(logging.WARNING)
        self._handle = handle
        self._dag: Any = None
        self._lock = threading.Lock()
        self._up = threading.Event()
        self._closed = False
        self.failed: str | None = None
        self._thread = threading.Thread(
            target=self._build, args=(node_id,), name="raysim-worker-link", daemon=True
        )
        self._thread.start()

    def _build(self, node_id: str) -> None:
        from ray.dag import InputNode

        try:
            if ray.get(self._handle.node_id.remote()) != node_id:
                self.failed = "the worker runs on another node"
                return
            with InputNode() as request:
                graph = self._handle.serve.bind(request)
            _proxy_is_this_actor()
            caller = _this_actor_class()
            if caller is not None:  # before the worker reads this actor's handle
                ray.get(self._handle.__ray_call__.remote(_stand_in_for, caller))
            with self._lock:
                if self._closed:
                    return
                self._dag = graph.experimental_compile(
                    _submit_timeout=-1, _max_inflight_executions=MAX_IN_FLIGHT
                )
            ref = self._dag.execute(None)
            try:
                self._answer(ref)  # the worker's loop is up
            except BaseException:
                self.forget(ref)  # the worker died while its link was being built
                raise
            self._up.set()
        except Exception as e:  # noqa: BLE001 - the pool then uses plain calls
            self.failed = f"{type(e).__name__}: {e}"
            logging.getLogger("raysim").debug("no compiled graph to a worker: %s", self.failed)

    @property
    def ready(self) -> bool:
        return self._up.is_set() and self.failed is None and not self._closed

    def execute(self, request: tuple[Any, ...]) -> Any:
        """Send one request; its ``CompiledDAGRef`` is read with ``fetch``."""
        return self._dag.execute(request)

    def fetch(self, ref: Any) -> Any:
        """The answer to a request (waits as long as the work takes)."""
        return self._answer(ref)

    def _answer(self, ref: Any) -> Any:
        """``ref``'s answer, waited for by looking at the channel with growing pauses (50 µs to
        ``POLL_MAX_S``). Ray 2.60's blocking read spins on a core for as long as it waits
        (ray-project/ray#55128, not merged): a 30 ms batch cost the coordinator 30 ms of CPU,
        looked at this way 2 ms, for about 0.5 ms more latency."""
        from ray.exceptions import RayChannelTimeoutError

        look = getattr(self._dag, "_execute_until", None)  # private in Ray 2.60; else block
        pause = 5e-5
        while look is not None:
            try:
                look(ref._execution_index, ref._channel_index, 0)
                break
            except RayChannelTimeoutError:
                time.sleep(pause)
                pause = min(2 * pause, POLL_MAX_S)
        return ref.get(timeout=-1)

    @staticmethod
    def forget(ref: Any) -> None:
        """Give up a request whose answer will not be read (its link failed). Collected unread,
        Ray's ``CompiledDAGRef`` would read its channel to free the buffer; where the graph
        failed, that raises inside ``__del__``, and Ray prints the traceback from the
        coordinator's process to the driver's console."""
        if hasattr(ref, "_ray_get_called"):  # private in Ray 2.60, as ``_execute_until``
            ref._ray_get_called = True

    def close(self, unread: Iterable[Any] = ()) -> bool:
        """Stop the worker's loop; the worker stays up for plain calls. ``unread``: the requests
        sent and not read, given up (``forget``). False if the loop may still be running (Ray's
        teardown failed or timed out)."""
        for ref in unread:
            self.forget(ref)
        with self._lock:
            self._closed = True
            dag, self._dag = self._dag, None
        if dag is None:
            return True
        try:
            dag.teardown()
        except Exception as e:  # noqa: BLE001 - reported by the caller's choice
            logging.getLogger("raysim").debug("compiled graph teardown: %s", e)
            return False
        return True


_PROXY_LOCK = threading.Lock()


def in_actor() -> bool:
    """Whether this process is a Ray actor, where a link costs no process of its own
    (``_proxy_is_this_actor``)."""
    return ray.get_runtime_context().get_actor_id() is not None


def _this_actor_class() -> tuple[str, str, str, str] | None:
    """This actor's class, as Ray names it (module, function, class, source hash), for the
    worker to stand in for (``_stand_in_for``). None in a driver, or where Ray's internals
    differ from the pinned version's."""
    if not in_actor():
        return None
    what = getattr(
        ray.get_runtime_context().current_actor, "_ray_actor_creation_function_descriptor", None
    )
    names = ("module_name", "function_name", "class_name", "function_hash")
    if what is None or not all(hasattr(what, n) for n in names):
        return None
    return tuple(getattr(what, n) for n in names)  # type: ignore[return-value]


class _StandIn:
    """What a worker takes for the class of the actor that links to it (``_stand_in_for``)."""


def _stand_in_for(worker: Any, actor_class: tuple[str, str, str, str]) -> None:
    """Run on a worker (``__ray_call__``) before the link's graph is compiled: the calling
    actor's class is taken as ``_StandIn`` when the worker reads that actor's handle (the graph
    hands it over as the driver's proxy, ``_proxy_is_this_actor``), instead of being loaded.
    A Tune trial's class loads Tune's modules, about 0.4 s in which the worker trains nothing
    on 2 vCPUs; the coordinator's costs little, and gets the same. The worker never calls that
    actor: Ray calls the proxy only from another node, and links reach only this node's
    workers."""
    from ray._private.worker import global_worker
    from ray._raylet import PythonFunctionDescriptor

    manager = getattr(global_worker, "function_actor_manager", None)
    loaded = getattr(manager, "_loaded_actor_classes", None)
    if isinstance(loaded, dict):
        loaded.setdefault(PythonFunctionDescriptor(*actor_class).function_id, _StandIn)


def _proxy_is_this_actor() -> None:
    """Graphs compiled in this process get this actor as their "driver proxy" instead of a new
    actor each.

    Ray 2.60 starts an empty actor (``CompiledDAG.DAGDriverProxyActor``) for every graph, a
    process of its own (about 1 s of CPU on 2 vCPUs), only so that a writer on another node can
    run a function on the driver's node. A link goes only to a worker on this process's node,
    where Ray never calls the proxy; so the calling actor stands in. A driver, or a Ray whose
    internals differ from the pinned version's, keeps Ray's proxy."""
    try:
        from ray.dag.compiled_dag_node import CompiledDAG
    except ImportError:  # pragma: no cover - another Ray layout
        return
    with _PROXY_LOCK:
        proxy = getattr(CompiledDAG, "DAGDriverProxyActor", None)
        if proxy is not None and not isinstance(proxy, _ThisActorProxy):
            CompiledDAG.DAGDriverProxyActor = _ThisActorProxy(proxy)


class _ThisActorProxy:
    """In place of Ray's proxy actor class: ``.options(...).remote()`` gives the calling actor's
    own handle, or a new proxy actor where the caller is a driver."""

    def __init__(self, ray_proxy: Any) -> None:
        self._ray_proxy = ray_proxy

    def options(self, **options: Any) -> Any:
        if not in_actor():
            return self._ray_proxy.options(**options)
        here = ray.get_runtime_context().current_actor
        return SimpleNamespace(remote=lambda: here)
