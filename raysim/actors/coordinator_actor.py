"""The coordinator as a Ray actor: builds data, worker pool, evaluator and tracker, then steps.

With ``checkpoint.every`` it writes a checkpoint every N rounds; given a resume source it restores
the last one into a freshly built run before the first step (``raysim/state/checkpoint.py``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from raysim.actors.executor import InProcessExecutor
from raysim.errors import Diverged, RunSetupError
from raysim.tracking import timeline
from raysim.tracking.store import NODE_TAG, SESSION_TAG, open_store
from raysim.tracking.tracker import Tracker

if TYPE_CHECKING:
    from raysim.actors.coordinator_core import CoordinatorCore
    from raysim.actors.pool import RayWorkerPool, WorkerLaunch
    from raysim.config import RunConfig

__all__ = ["CONCURRENCY_GROUPS", "Coordinator", "RunSetupError"]

#: the actor's ``ray.remote`` option: ``stop`` runs in a thread of its own, beside a round (the
#: driver calls it with ``.options(concurrency_group=CONTROL)``)
CONTROL = "control"
CONCURRENCY_GROUPS = {CONTROL: 1}


#: how long ``stop`` waits for a run being made in MLflow (its store is open by then: ~0.1 s)
OPENING_S = 10.0

#: the run's plan, as its driver followed it (``RunPlan.describe``), among its artifacts
PLAN_FILE = "plan.json"


class RunStopped(RuntimeError):
    """``Coordinator.stop`` came before the run's MLflow run was begun: none is made."""


class Coordinator:
    """Owns the run; the single MLflow writer. Wrapped with ``ray.remote`` by the driver, or
    built in the driver's own process (a Tune trial's, or a run without Ray,
    ``raysim.launch.without_ray``): this module imports Ray only where the run has worker actors."""

    def __init__(
        self,
        config: dict[str, Any],
        pool_size: int,
        tracking_uri: str | None,
        resume: dict[str, Any] | None = None,
        session: str | None = None,
        restarts: int = 0,
        launch: WorkerLaunch | None = None,
        worker_here: bool = False,
        started: list[Any] | None = None,
        tracker_process: bool = False,
        plan: str = "",
    ) -> None:
        """``plan``: the plan the driver follows (``RunPlan.describe``), kept as the run's
        ``plan.json``. ``launch``: the workers to start first, before this process imports torch
        and the methods (``WorkerLaunch``; None: started once the config is read);
        ``started``: workers started from it already (by ``RunSession``'s driver, or a Tune
        trial's, ``raysim.sweeps.early``). ``worker_here``: no worker actor; the clients
        train in this process (``InProcessExecutor``), one pooled
        worker's way (``RunSession``'s ``worker_here``).
        ``tracker_process``: MLflow's writer runs in a child process of its own
        (``raysim.tracking.process``; a run without Ray has no actor process to hide it in).
        ``session`` tags the MLflow run (the driver's ``SESSION_TAG``); ``restarts``: how many
        coordinators of this run died before this one. The run is set up by ``ready``, not here,
        so that ``stop`` can answer while it is: an exception while setting up (data that
        cannot be loaded, a missing file) is raised by ``ready`` as a ``RunSetupError``: a task
        error, which the driver reports once, where an actor dying in its constructor would be
        replaced and fail the same way again."""
        from raysim.util.buffers import prefer_huge_pages
        from raysim.util.quiet import quiet_libraries

        prefer_huge_pages()  # before torch is imported: the server's model-sized arithmetic
        quiet_libraries()
        timeline.role("coordinator")
        self._setup_error: RunSetupError | None = None
        self._plan = plan
        #: the round the newest checkpoint resumes at (None: none written or restored)
        self.saved_round: int | None = None
        self._stopping = threading.Event()  # ``stop`` was called: no checkpoint starts after
        self._saving = threading.Lock()  # held while a checkpoint is written
        self._opened: list[Tracker] = []  # MLflow runs this actor opened, for ``stop``
        self._opening_lock = threading.Lock()  # ``stop`` sees each run opened, or it sees stop
        #: set once the MLflow run being made exists and ``stop`` can see it (None: none begun)
        self._made: threading.Event | None = None
        self.pool: RayWorkerPool | InProcessExecutor | None = None
        self.tracker: Tracker | None = None
        self._tracking: Future[Tracker] | None = None  # the new run's, made in a thread
        self._started = started or ([launch.start() for _ in range(launch.count)] if launch else [])
        self._opening = None  # a fresh store's schema (~2 s) is made while the workers start
        #: ``tracker_process``: MLflow's writer in a child process, started now (a run without
        #: Ray, ``raysim.tracking.process``)
        self._writer = None
        if tracker_process and tracking_uri and config["tracking"]["enabled"]:
            from raysim.tracking.process import TrackerProcess

            self._writer = TrackerProcess(tracking_uri)
        elif tracking_uri and config["tracking"]["enabled"]:
            self._opening = threading.Thread(
                target=_open_quietly, args=(tracking_uri,), daemon=True
            )
            self._opening.start()
        self._setup_args: tuple | None = (
            config, pool_size, tracking_uri, resume, session, restarts, launch, worker_here
        )  # fmt: skip

    def _setup(
        self,
        config: dict[str, Any],
        pool_size: int,
        tracking_uri: str | None,
        resume: dict[str, Any] | None,
        session: str | None,
        restarts: int,
        launch: WorkerLaunch | None,
        worker_here: bool = False,
    ) -> None:
        from raysim.actors.coordinator_core import CoordinatorCore
        from raysim.actors.evaluation import evaluator_for
        from raysim.algorithms.registry import get_method
        from raysim.config import config_from_wire
        from raysim.sim.build import attacking_clients, run_dataset, server_context
        from raysim.state import checkpoint

        cfg = config_from_wire(config)
        self.cfg = cfg
        saved = None  # read before taking anything: a checkpoint that does not load fails here
        if resume:
            try:
                saved = checkpoint.load(resume, cfg)
            except checkpoint.ResumeError:
                # a replacement for a coordinator that died before a usable checkpoint reopens
                # the run at round 0 (every round is deterministic; the driver replays them)
                if not resume.get("or_from_start"):
                    raise
        dataset = run_dataset(cfg)
        method = get_method(cfg.algorithm.name)
        if resume is None and cfg.tracking.enabled and tracking_uri:
            # a new run's MLflow run is made while the workers start (it waits on nothing else)
            making = ThreadPoolExecutor(1, thread_name_prefix="raysim-tracking")
            self._tracking = making.submit(self._new_tracker, cfg, method, tracking_uri, session)
            making.shutdown(wait=False)  # its thread ends with this one task
        if worker_here:
            from raysim.actors.worker import ClientRunner

            runner = ClientRunner(cfg, dataset, cfg.workers.threads)
            where = {
                "node_id": _node(),
                "pid": os.getpid(),
                "gpu_ids": [],  # a worker here has no GPUs (``can_host_worker``)
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            }
            self.pool = InProcessExecutor(runner, where=where)
        else:
            import ray

            from raysim.actors.pool import RayWorkerPool

            # held for the whole run: restarted workers re-read it
            self.dataset_ref = ray.put(dataset)
            self.pool = RayWorkerPool(
                cfg, self.dataset_ref, pool_size, dataset.client_sizes(), launch, self._started
            )
        self._started = []  # the pool's now
        # the model lives on the workers; the server builds its own only if a strategy asks
        initial, layout = self.pool.initial_global()
        evaluator = evaluator_for(cfg, dataset, self.pool)
        self.evaluator = evaluator
        self._final_states: dict[int, dict] | None = None
        self._layout = layout
        server = server_context(cfg, dataset, layout)
        # the core first: a checkpoint that does not load leaves the MLflow run untouched
        self.core: CoordinatorCore = CoordinatorCore(
            cfg,
            initial,
            dataset.client_sizes(),
            self.pool,
            evaluator,
            server=server,
            state_root=_state_root(cfg, session),
        )
        if saved is not None:
            self.core.load_state_dict({**saved["core"], "strategy_private": saved["private"]})
            self.saved_round = self.core.round
        node = _node()
        if self._tracking is not None:
            self.tracker, self._tracking = self._tracking.result(), None
        elif cfg.tracking.enabled and tracking_uri:
            self.tracker = self._new_tracker(cfg, method, tracking_uri, session, resume)
        if self.tracker is not None:
            if resume is not None:
                if saved is not None:
                    self.tracker.warnings = list(saved.get("warnings", []))
                self.tracker.set_tag("raysim.resumed_at_round", str(self.core.round))
            if restarts:
                self.tracker.set_tag("raysim.coordinator_restarts", str(restarts))
            self.tracker.log_placement(node, self.pool.describe())
            if self._plan:
                self.tracker.log_dict({"plan": self._plan.splitlines()}, PLAN_FILE)
            if self.core.state_root is not None:  # clients.state.store: disk: where it lives
                self.tracker.set_tag("raysim.state.store", self.core.state_root)
            private = self.core.strategy.private_artifacts()
            if private and resume is None:
                self.tracker.log_private(private)
            if cfg.hooks.clients:
                self.tracker.log_dict(attacking_clients(cfg), "attackers.json")
            self.core.tracker = self.tracker
        self.checkpointer = (
            checkpoint.Checkpointer(cfg, self.tracker) if cfg.checkpoint.every else None
        )

    def _new_tracker(
        self,
        cfg: RunConfig,
        method: Any,
        tracking_uri: str,
        session: str | None,
        resume: dict[str, Any] | None = None,
    ) -> Tracker:
        """The run's MLflow run: a new one with its params, tags and config, or ``resume``'s;
        ``RunStopped`` where ``stop`` came first."""
        if self._opening is not None:
            self._opening.join()
        with self._opening_lock:  # a run stopped before its MLflow run was begun makes none
            if self._stopping.is_set():
                raise RunStopped("stopped before its MLflow run was made")
            self._made = made = threading.Event()  # ``stop`` waits for this one
        try:
            tracker = self._make_tracker(cfg, method, tracking_uri, session, resume)
            with self._opening_lock:
                if self._stopping.is_set():  # stopped while it was made: ``stop`` waits
                    tracker.fail("KILLED")
                self._opened.append(tracker)
        finally:
            made.set()
        return tracker

    def _make_tracker(
        self,
        cfg: RunConfig,
        method: Any,
        tracking_uri: str,
        session: str | None,
        resume: dict[str, Any] | None,
    ) -> Tracker:
        from raysim.config import flatten
        from raysim.security.policy import audit_tags

        args = {
            "experiment": cfg.tracking.experiment,
            "run_name": cfg.run_name(),
            "params": flatten(cfg.to_dict()),
            "tags": {
                "algorithm": method.name,
                "reference": method.reference,
                "seed": str(cfg.seed),
                **cfg.tracking.tags,
                **audit_tags(cfg),  # raysim.audit.leaks: on or off
                **({SESSION_TAG: session} if session else {}),
                NODE_TAG: _node(),
            },
            "parent_run_id": cfg.tracking.parent_run_id,
            "resume_run_id": resume.get("run_id") if resume else None,
        }
        tracker = self._writer.open(**args) if self._writer else Tracker(tracking_uri, **args)
        if resume is None:
            tracker.log_config(cfg.to_dict())
        return tracker

    def _abandon_tracking(self, error: str) -> None:
        """A setup that failed after its new MLflow run was made ends that run FAILED, with
        ``error`` as its ``raysim.error`` tag."""
        tracking, self._tracking = self._tracking, None
        if tracking is not None and tracking.exception() is None:
            tracker = tracking.result()
            tracker.set_tag("raysim.error", error)
            tracker.fail("FAILED")

    def ready(self) -> dict[str, Any]:
        """Set the run up (the first call), then say where it starts."""
        if self._setup_args is not None:
            args, self._setup_args = self._setup_args, None
            try:
                self._setup(*args)
            except Exception as e:  # noqa: BLE001 - one line, for the driver to report
                error = f"the run could not start: {type(e).__name__}: {e}"
                self._setup_error = RunSetupError(error)
                self._abandon_tracking(str(self._setup_error))
        if self._setup_error is not None:
            raise self._setup_error
        return {
            "run_id": self.tracker.run_id if self.tracker else None,
            "rounds": self.cfg.rounds,
            "round": self.core.round,
        }

    def step(self, settle: bool = True) -> dict[str, float]:
        """One round (``CoordinatorCore.step``), then a checkpoint if one is due."""
        try:
            metrics = self.core.step(settle)
        except Diverged as e:  # recorded on the run before it ends FAILED
            if self.tracker is not None:
                self.tracker.set_tag("raysim.error", str(e))
                self.tracker.set_tag("raysim.diverged_round", str(self.core.round))
            raise
        if self.checkpointer is not None and self.checkpointer.due(self.core.round):
            from raysim.state.checkpoint import CheckpointNotWritten

            try:
                self.save_checkpoint()
            except (OSError, CheckpointNotWritten) as e:  # never ends a sound run
                self.core.warn(
                    f"checkpoint before round {self.core.round} not written ({e}); the run goes "
                    "on and the next checkpoint tries again"
                )
        return metrics

    def advance(
        self, max_rounds: int, max_seconds: float, overlap: bool = True
    ) -> list[dict[str, float]]:
        """Rounds run back to back (at least one; at most ``max_rounds``; stopping once
        ``max_seconds`` of wall time have passed or the run is done): their metrics, in order.
        ``overlap``: each round's evaluation runs on the workers while the next round is
        dispatched (``CoordinatorCore.step``); the metrics returned are the same."""
        out, t0 = [], time.perf_counter()
        batched = self.tracker.rounds_batched() if self.tracker else contextlib.nullcontext()
        with timeline.span("advance call", self.core.round), batched:
            # the rounds of this call reach MLflow in one request, as ``batched`` ends
            try:
                while True:
                    out.append(self.step(settle=not overlap))
                    if self.core.done or len(out) >= max_rounds:
                        return out
                    if time.perf_counter() - t0 >= max_seconds:
                        return out
            finally:
                self.core.settle()

    def save_checkpoint(self) -> None:
        """Write the run's state now (MLflow ``checkpoint/`` and/or ``checkpoint.dir``); the
        rounds it covers are in the store already (a resumed run does not log them again)."""
        from raysim.state import checkpoint

        with self._saving, _stop_signals_held():
            if self._stopping.is_set():  # the run is KILLED already; its last one stands
                return
            core = self.core.state_dict()
            private = core.pop("strategy_private")  # its own file, never MLflow (checkpoint.py)
            state = {"core": core, "warnings": list(self.tracker.warnings) if self.tracker else []}
            writer = self.checkpointer or checkpoint.Checkpointer(self.cfg, self.tracker)
            everywhere = writer.save(state, self.core.round, private)
            self.core.checkpoint_written(everywhere)
            if writer is not self.checkpointer:
                writer.close()
            self.saved_round = self.core.round

    def done(self) -> bool:
        return self.core.done

    def workers(self) -> list[dict[str, Any]]:
        return self.pool.describe()

    def kill_worker(self, index: int) -> None:
        """Fault injection from the driver (tests, chaos experiments)."""
        self.pool.kill_worker(index)

    def client_states(self) -> dict[int, dict]:
        """Every client's personal state as arrays; after ``finish``, what it recorded
        (``CoordinatorCore.final_states``)."""
        if self._final_states is not None:
            return self._final_states
        return self.core.materialized_states()

    def weights(self):
        return self.core.weights

    def finish(self) -> dict[str, Any]:
        core = self.core
        self._final_states, note = core.final_states()  # one fetch for MLflow and the driver
        if note:
            core.warn(note)
        summary = {
            "metrics": core.final_metrics(),
            "history": core.history,
            "weights_digest": core.digest(),
            "run_id": self.tracker.run_id if self.tracker else None,
            "clients": core.result_rows(),
            # the store's folder, where a client's state went to it (a method with none
            # leaves it empty: nothing to keep)
            "state_store": core.state_root if core.stored_states() else None,
        }
        if self.tracker is not None:
            self.tracker.log_round(
                self.cfg.rounds,
                {f"final_{k}": v for k, v in summary["metrics"].items()},
                final=True,
            )
            try:
                self.tracker.log_final(
                    self.cfg.to_dict(),
                    self.named_weights(),
                    core.client_rows(),
                    core.history,
                    {"weights_digest": summary["weights_digest"], **summary["metrics"]},
                    self._final_states,
                    core.strategy.tables(),
                    self.pool.describe(),
                    client_columns=core.client_columns(),
                )
            except OSError as e:  # the driver saves the weights where the user is instead
                summary["unsaved"] = f"the run's artifacts could not be written ({e})"
                self.tracker.set_tag("raysim.error", summary["unsaved"])
                self.tracker.fail("FAILED")
        return summary

    def named_weights(self) -> dict[str, Any]:
        return self._layout.unflatten(self.core.weights)

    def fail(self, status: str = "FAILED") -> None:
        if self.tracker is not None and not self.tracker.ended:
            self.tracker.fail(status)

    def stop(self) -> dict[str, int | None]:
        """An interrupted run, ended at once: answered while a round runs (its own thread, the
        ``control`` concurrency group). A checkpoint being written is finished first and none
        starts after; the run is marked KILLED. Returns the rounds done and the round its
        newest checkpoint resumes at; the driver then ends this actor and its workers."""
        with self._opening_lock:
            self._stopping.set()
            made = self._made
        # an MLflow run being made (set-up, in a thread or not) is marked KILLED once it exists
        # (``_new_tracker``): wait for that, or the driver ends this actor and it stays RUNNING.
        # One not begun yet (the store still opening, ~2 s) is never made: nothing to wait for
        if made is not None:
            made.wait(timeout=OPENING_S)
        with self._opening_lock:
            opened = list(self._opened)
        with self._saving:
            for tracker in opened:  # one, or none yet: ``_new_tracker`` marks it
                if not tracker.ended:
                    tracker.fail("KILLED")
        core = getattr(self, "core", None)
        return {"round": core.round if core else None, "saved_round": self.saved_round}

    def close(self) -> None:
        """Stop the workers; a run closed before ``finish`` is marked KILLED (resumable)."""
        try:
            self.fail("KILLED")
        finally:
            if self._writer is not None:  # after the run's last call to it
                self._writer.close()
            if getattr(self, "checkpointer", None) is not None:
                self.checkpointer.close()  # checkpoint.dir is free for a resumption
            if self.pool is not None:
                self.pool.close()
            for worker in self._started:  # started before a setup that failed
                import ray

                ray.kill(worker)


def _state_root(cfg: RunConfig, session: str | None) -> str | None:
    """``clients.state.store: disk``: the session's folder of the store, so that a coordinator
    that replaces a dead one writes where it did (a resumed run takes its checkpoint's)."""
    if cfg.clients.state.store != "disk" or session is None:
        return None
    from raysim.state.store import run_folder

    return run_folder(cfg.clients.state.dir, session)


def _node() -> str:
    """The Ray node this process runs on; without Ray, ``local:`` and the host's name."""
    from raysim.launch.without_ray import ray_is_up

    if not ray_is_up():
        return f"local:{socket.gethostname()}"
    import ray

    return ray.get_runtime_context().get_node_id()


def _open_quietly(uri: str) -> None:
    """``open_store`` ahead of the ``Tracker``; a failure is left for the ``Tracker`` to report."""
    try:
        open_store(uri)
    except Exception:  # noqa: BLE001, S110 - raised again, in one line, where the run opens it
        pass


@contextlib.contextmanager
def _stop_signals_held():
    """SIGINT and SIGTERM held back while a checkpoint is written in the main thread (a run
    without Ray, where their handlers raise in the thread that is saving): the save ends, and
    the round it holds is known, before the stop the signal asks for; the signal is then raised
    again for its own handler. Elsewhere (an actor's own thread) a no-op."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(caught):  # each once, in the order they came
            signal.raise_signal(signum)
