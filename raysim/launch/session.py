"""Python entry points: ``run(config, overrides) -> Result`` and the ``RunSession`` driver loop.

The driver owns nothing but the loop: ``while not done: metrics = coordinator.step()``. The CLI,
the API and (later) the Ray Tune trainable all go through ``RunSession``. ``resume=`` continues a
checkpointed run (an MLflow run id, or a checkpoint directory) from its last checkpoint.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.actors.jobs import STOPPED_EARLY
from raysim.config import ConfigError, RunConfig, load_config
from raysim.launch.plan import RunPlan, plan_run
from raysim.launch.private_ray import (  # noqa: F401  (re-exported: raysim.launch.session is where users look)
    ClusterError,
    check_reachable,
    ensure_ray,
    ray_address,
)
from raysim.launch.resources import local_resources  # noqa: F401  (re-exported)
from raysim.state.checkpoint import ResumeSource, prepare_resume
from raysim.tracking import timeline
from raysim.tracking.store import SESSION_TAG

if TYPE_CHECKING:
    from raysim.actors.pool import WorkerLaunch

log = logging.getLogger("raysim")


@dataclass
class Result:
    """What a finished run gives back (``raysim.run``, ``RunSession.finish``)."""

    metrics: dict[str, float]
    """The final metrics: the last evaluation's scores (``accuracy``, ``loss``, ...), then the
    run's totals (``rounds``, ``wall_time_s``, ``total_bytes_up``, ``total_updates``, ...)."""
    history: list[dict[str, float]]
    """Every round's metrics, in round order."""
    run_id: str | None
    """The MLflow run's id (None without tracking)."""
    weights_digest: str
    """sha256 of the final global weights as little-endian float32 bytes: equal digests, equal
    models (the reproducibility check)."""
    config: RunConfig
    """The config the run ran with, validated."""
    tracking_uri: str | None = None
    """The MLflow tracking URI the run was logged to (None without tracking)."""
    clients: list[dict[str, Any]] = field(default_factory=list)
    """One row per client that took part (its counters, then its last evaluation's scores), as
    in the ``clients.csv`` artifact; empty above 100,000 clients."""
    weights: np.ndarray | None = None
    """The final global vector (flat float32, in the model's ``Layout`` order)."""
    client_states: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    """Each client's personal state at the end, by client id, as ``tracking.client_states``
    records it (empty where it records none)."""
    unsaved: str | None = None
    """Set when the run finished but its artifacts could not be written: why, and where the
    driver saved the weights instead (the MLflow run is then marked FAILED)."""
    state_store: str | None = None
    """``clients.state.store: disk``: the folder of the run's personal-state store."""
    plan: str = ""
    """The plan the run followed (``RunPlan.describe``: what ``raysim run --dry-run`` prints)."""


#: where the driver saves a finished run's weights when the artifact store refuses them
UNSAVED_DIR, WEIGHTS = "raysim-unsaved", "weights.safetensors"


def preflight(cfg: RunConfig, address: str | None = None, plan: RunPlan | None = None) -> None:
    """Refuse, before Ray starts, a run that cannot start (``raysim.launch.preflight``: a file
    the config names that is not here, a named cluster that does not answer, a
    ``checkpoint.dir`` another live run writes to), or whose workers or sizes do not fit
    (``plan_run``). ``plan``: the run's, resolved already; else ``cfg`` is planned here (which
    runs the checks)."""
    if plan is None:
        plan_run(cfg, address)
    elif not plan.checked:
        from raysim.launch.preflight import preflight as check

        check(plan)


def _plan_for(plan: RunPlan, address: str | None) -> RunPlan:
    """``plan``, refused where the caller also names another Ray address than it was made for
    (a plan is followed as it is: planned again, it would size another pool)."""
    if address is not None and address != plan.target:
        raise ConfigError(
            f"this run's plan was made for Ray at {plan.target}, not {address}: plan it again "
            "for that address (plan_run(cfg, address)) or leave address out"
        )
    return plan


#: wall time of rounds the coordinator runs per driver call in ``RunSession.rounds``
ADVANCE_S = 0.25
#: how long a stopped run waits for its coordinator to mark it KILLED: it answers at once, unless
#: it is writing a checkpoint, which it finishes first (``Coordinator.stop``)
STOP_S = 60.0

#: how often one run replaces a coordinator that died before it gives up
MAX_COORDINATOR_RESTARTS = 3


def can_host_coordinator(cfg: RunConfig) -> bool:
    """Whether the caller's process may run ``cfg``'s coordinator (``coordinator_here``): not
    one that asks for GPUs (its own actor gets them), nor one a fault is set to kill
    (``raysim.launch.without_ray.coordinator_refusal`` says which)."""
    from raysim.launch.without_ray import coordinator_refusal

    return coordinator_refusal(cfg) is None


def can_host_worker(cfg: RunConfig, num_workers: int, coordinator_here: bool = True) -> bool:
    """Whether the process that runs ``cfg``'s coordinator may also train its clients
    (``worker_here``, ``workers.transport: in_process``, a run without Ray): one pooled worker,
    on CPUs, that no fault is set to kill, beside a coordinator without GPUs
    (``raysim.launch.without_ray.worker_refusal`` says why not). ``coordinator_here``: that process
    is the caller's (``can_host_coordinator``), not the coordinator's own actor."""
    from raysim.launch.without_ray import worker_refusal

    return worker_refusal(cfg, num_workers, coordinator_here) is None


class CoordinatorLost(RuntimeError):
    """The coordinator died more often than ``MAX_COORDINATOR_RESTARTS``."""


class RunSession:
    """Starts the coordinator actor for one validated config and steps it round by round.

    ``resume`` (an MLflow run id, a checkpoint directory, or a ``ResumeSource`` from
    ``raysim.state.checkpoint.prepare_resume``) restores the run's last checkpoint instead of
    starting
    afresh; ``cfg`` may then be None (the checkpoint's config is used) or must match it.
    ``force`` resumes a run whose status is still RUNNING (its driver died unannounced).
    ``resources`` is what the run may use (default: the whole cluster; a Tune trial passes its
    placement group's share). ``coordinator_here`` runs the coordinator in this process instead
    of its own actor, where this process is itself a Ray actor with nothing else to do (a Tune
    trial): one process fewer to start, one hop fewer per round. It needs a coordinator without
    GPUs and no ``faults.kill_coordinator`` (the run then uses an actor as usual); a coordinator
    that fails here fails its caller, which is not replaced. ``worker_here`` (with
    ``coordinator_here``) also trains the clients in this process, where ``can_host_worker``
    allows (a Tune trial that asks for it has no worker bundle to start an actor in: a config
    that cannot is refused); ``workers.transport: in_process`` does the same in the
    coordinator's own actor. ``started`` hands over workers started before the run (a Tune
    trial's, ``raysim.sweeps.early.take``): given the run's ``WorkerLaunch`` (None where it
    starts no worker actor), it returns those that came from the same launch, and the run starts
    the rest. Without any of these, ``cfg.runtime`` says whether the run starts Ray at all
    (``raysim.launch.without_ray``: ``local`` is then True and the whole run is in this process).
    """

    def __init__(
        self,
        cfg: RunConfig | None = None,
        address: str | None = None,
        *,
        resume: str | os.PathLike | ResumeSource | None = None,
        force: bool = False,
        resources: Mapping[str, float] | None = None,
        coordinator_here: bool = False,
        worker_here: bool = False,
        started: Callable[[WorkerLaunch | None], list[Any]] | None = None,
        plan: RunPlan | None = None,
    ) -> None:
        from raysim.launch.placement import check_state_outlives_job, check_store_outlives_job

        timeline.role("driver")
        if plan is not None:  # one resolved already (``raysim.launch.plan.plan_run``)
            plan = _plan_for(plan, address)
        else:
            plan = plan_run(
                cfg,
                address,
                resume=resume,
                force=force,
                resources=None if resources is None else dict(resources),
                coordinator_here=coordinator_here,
                worker_here=worker_here,
                placed=started is not None,
            )
        #: what this session carries out, decided before anything started
        self.plan = plan
        self.cfg = cfg = plan.cfg
        self.resumed_from: ResumeSource | None = plan.resume
        self.actor = None
        self.here = None  # the coordinator itself, where it runs in this process
        #: a coordinator actor's first workers, started here beside it rather than by it once
        #: it runs (0.2-0.3 s sooner: a worker's imports are the start's critical path);
        #: ended here if that coordinator dies, since this process owns them
        self._own_workers: list[Any] = []
        self._in_process = plan.coordinator_here
        self._worker_here = plan.worker_here
        self.tracking_uri = plan.tracking_uri
        check_store_outlives_job(self.tracking_uri)
        check_state_outlives_job(cfg)
        self._started_ray = False
        self.coordinator_restarts = 0
        self._stopped_early = False
        self._session = uuid.uuid4().hex  # tags the MLflow run, so a replacement finds it
        self._first_source = plan.resume.for_actor() if plan.resume else None
        self.run_id: str | None = None
        self.round = plan.resume.round if plan.resume else 0
        #: after ``stop``: the coordinator's rounds done and the round its newest checkpoint
        #: resumes at (None where it could not say)
        self.stopped: dict[str, int | None] | None = None
        self.finished = False  # ``finish`` returned: the run is FINISHED in MLflow
        #: the whole run in this process, without Ray (``runtime``, ``raysim.launch.without_ray``)
        self.local = plan.local
        if self.local:
            self.pool_size, self._launch, self._started = 1, None, []
            try:
                self._start_coordinator(self._first_source)
            except BaseException as e:
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    self.stop()
                self.close()
                raise
        else:
            self._start_on_ray(started)
        # a script that exits without close(): mark the run KILLED before Ray's own exit hook
        atexit.register(self.close)

    def _start_on_ray(self, started: Callable[[WorkerLaunch | None], list[Any]] | None) -> None:
        """Start (or join) Ray, then the plan's first workers and its coordinator."""
        import ray

        from raysim.actors.coordinator_actor import CONCURRENCY_GROUPS, Coordinator
        from raysim.actors.pool import WorkerLaunch
        from raysim.launch.placement import coordinator_options

        cfg = self.cfg
        if not ray.is_initialized() and self.tracking_uri:
            # before ray.init: Ray's processes inherit the driver's environment as it starts
            # them, so every worker and the coordinator find the same store
            os.environ["MLFLOW_TRACKING_URI"] = self.tracking_uri
        self._started_ray = ensure_ray(target=self.plan.target, resources=self.plan.resources)
        try:
            self.plan = self.plan.on_cluster(ray.cluster_resources())  # a named cluster's pool
            self.pool_size = self.plan.pool_size
            self._launch = (
                None if self._worker_here else WorkerLaunch.for_config(cfg, self.pool_size)
            )
            #: workers started from that launch already (a Tune trial's, ``started``)
            self._started = started(self._launch) if started else []
            if self._launch is not None and not (self._started or self._in_process):
                self._own_workers = [self._launch.start() for _ in range(self._launch.count)]
                self._started = list(self._own_workers)
            if not self._in_process:
                remote = ray.remote(concurrency_groups=CONCURRENCY_GROUPS)(Coordinator)
                self._coordinator = remote.options(**coordinator_options(cfg, self.tracking_uri))
            try:
                self._start_coordinator(self._first_source)
            except ray.exceptions.ActorDiedError as died:
                self._replace_coordinator(died)
        except BaseException as e:
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                self.stop()
            self.close()
            raise

    def _start_coordinator(self, source: dict[str, Any] | None) -> dict[str, Any]:
        args = (self.cfg.to_dict(), self.pool_size, self.tracking_uri, source)
        kwargs: dict[str, Any] = {
            "session": self._session,
            "launch": self._launch,
            "plan": self.plan.describe(),
        }
        if self._started:  # taken by the first coordinator only
            kwargs["started"], self._started = self._started, []
        if self._in_process:
            from raysim.actors.coordinator_actor import Coordinator

            kwargs["tracker_process"] = self.local
            self.here = Coordinator(*args, worker_here=self._worker_here, **kwargs)
            info = self.here.ready()
        else:
            import ray

            restarts = self.coordinator_restarts
            kwargs["worker_here"] = self._worker_here
            self.actor = self._coordinator.remote(*args, restarts=restarts, **kwargs)
            info = ray.get(self.actor.ready.remote())
        self.run_id, self.round = info["run_id"], int(info["round"])
        return info

    def _call(self, method: str, *args: Any) -> Any:
        """``ray.get`` of a coordinator method; a coordinator that died is replaced first."""
        if self.here is not None:
            return getattr(self.here, method)(*args)
        import ray

        while True:
            try:
                return ray.get(getattr(self.actor, method).remote(*args))
            except ray.exceptions.ActorDiedError as died:
                self._replace_coordinator(died)

    def step(self) -> dict[str, float]:
        kill = self.cfg.faults.kill_coordinator
        if kill is not None and kill.round == self.round and not self.coordinator_restarts:
            import ray

            ray.kill(self.actor, no_restart=True)  # fault injection (faults.kill_coordinator)
        metrics = self._call("step")
        self.round += 1
        self._stopped_early = self._stopped_early or bool(metrics.get(STOPPED_EARLY))
        return metrics

    def _replace_coordinator(self, died: BaseException) -> None:
        """The coordinator died before finishing round ``self.round`` (or starting): start
        another from the run's newest usable checkpoint, else from round 0 (every round is
        deterministic), and replay up to this round without reporting it again. Gives up after
        ``MAX_COORDINATOR_RESTARTS``, and the run is then marked FAILED."""
        import ray

        reached = self.round
        self._end_own_workers()  # the next coordinator starts its own
        while True:
            if self.coordinator_restarts >= MAX_COORDINATOR_RESTARTS:
                self._mark("FAILED")  # nobody else can: MLflow's only writer is gone
                raise CoordinatorLost(
                    f"the coordinator died {self.coordinator_restarts + 1} times; gave up at "
                    f"round {reached}"
                ) from died
            self.coordinator_restarts += 1
            try:
                info = self._start_coordinator(self._source_after_death())
                log.warning(
                    "the coordinator died at round %d (%s); another took over from %s",
                    reached,
                    type(died).__name__,
                    f"the checkpoint of round {info['round']}" if info["round"] else "round 0",
                )
                while self.round < reached:  # reported to the caller already
                    ray.get(self.actor.step.remote())
                    self.round += 1
                return
            except ray.exceptions.ActorDiedError as again:
                died = again

    def _source_after_death(self) -> dict[str, Any] | None:
        """Where a replacement coordinator starts: the run the dead one opened (found by this
        session's tag if it died starting), from its newest usable checkpoint or round 0."""
        run_id = self.run_id or self._find_run() or (self._first_source or {}).get("run_id")
        if run_id is None and not self.cfg.checkpoint.dir:
            return self._first_source  # it recorded nothing: start as it did
        return {
            "run_id": run_id,
            "dir": self.cfg.checkpoint.dir,
            "tracking_uri": self.tracking_uri,
            "or_from_start": True,
        }

    def _find_run(self) -> str | None:
        if not self.tracking_uri:
            return None
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.tracking_uri)
        exp = client.get_experiment_by_name(self.cfg.tracking.experiment)
        if exp is None:
            return None
        runs = client.search_runs(
            [exp.experiment_id], f"tags.`{SESSION_TAG}` = '{self._session}'", max_results=1
        )
        return runs[0].info.run_id if runs else None

    def _mark(self, status: str) -> None:
        """End the MLflow run from the driver; only for when the coordinator cannot."""
        run_id = getattr(self, "run_id", None)
        if run_id and self.tracking_uri:
            from mlflow.tracking import MlflowClient

            try:
                MlflowClient(self.tracking_uri).set_terminated(run_id, status)
            except Exception as e:  # noqa: BLE001 - best effort on an error path
                log.warning("could not mark run %s %s: %s", run_id, status, e)

    @property
    def done(self) -> bool:
        """Every planned round run, or the run ended early as finished (a privacy budget)."""
        return self.round >= self.cfg.rounds or self._stopped_early

    def rounds(self, overlap: bool = True) -> Iterator[dict[str, float]]:
        """Every remaining round's metrics, in order. The coordinator runs them in batches of up
        to ``ADVANCE_S`` of wall time per call (one driver round trip per batch, not per round),
        each round's evaluation overlapping the next round's dispatch unless ``overlap`` is off;
        a batch stops before a ``faults.kill_coordinator`` round, so the fault lands where
        ``step`` puts it. A coordinator that dies mid-batch is replaced and replays to the last
        round reported here; the rounds it ran after that are run again (deterministically)."""
        while not self.done:
            limit = self.cfg.rounds - self.round
            kill = self.cfg.faults.kill_coordinator
            if kill is not None and not self.coordinator_restarts and kill.round >= self.round:
                limit = min(limit, kill.round - self.round)
            if not limit:  # the fault's round: ``step`` injects it
                yield self.step()
                continue
            with timeline.span("driver call", self.round):
                batch = self._call("advance", limit, ADVANCE_S, overlap)
            for metrics in batch:
                self.round += 1
                self._stopped_early = self._stopped_early or bool(metrics.get(STOPPED_EARLY))
                yield metrics

    def workers(self) -> list[dict[str, Any]]:
        return self._call("workers")

    def checkpoint(self) -> None:
        """Write a checkpoint now (besides the ``checkpoint.every`` ones)."""
        self._call("save_checkpoint")

    def fail(self, status: str = "FAILED") -> None:
        """Mark the run FAILED (or KILLED) in MLflow; best effort, for error paths."""
        if self.here is not None:
            self.here.fail(status)
        elif getattr(self, "actor", None) is not None:
            import ray

            try:
                ray.get(self.actor.fail.remote(status), timeout=30)
            except ray.exceptions.ActorDiedError:
                self._mark(status)  # the coordinator is gone: mark the run from here
            except Exception:  # noqa: BLE001
                pass

    def stop(self) -> None:
        """End the run KILLED now (Ctrl-C, SIGTERM), whatever it is doing. The coordinator
        answers while it sets up or runs a round (``Coordinator.stop``), and ``stopped`` says
        where it was; one that cannot answer is ended, and the run it opened (found by this
        session's tag) is marked KILLED from here. The actor is gone after: ``close`` is quick."""
        if self.finished:  # nothing to stop: ``close`` ends the actors
            return
        if self.here is not None:
            self.stopped = self.here.stop()
            return
        actor, self.actor = getattr(self, "actor", None), None
        if actor is None:
            return
        import ray

        from raysim.actors.coordinator_actor import CONTROL

        with contextlib.suppress(Exception):  # it answers once constructed, setting up or not
            stopping = actor.stop.options(concurrency_group=CONTROL).remote()
            self.stopped = ray.get(stopping, timeout=STOP_S)
        alive = actor.__ray_ready__.remote()  # fails once the actor is dead
        ray.kill(actor, no_restart=True)
        if self.stopped is None:
            ray.wait([alive], timeout=10)  # dead: it can open or write nothing more
            self._end_opened_run("KILLED")

    def _end_opened_run(self, status: str) -> None:
        """Mark ``status`` the MLflow run this session's coordinator opened, where it is still
        RUNNING: a coordinator that could not answer (found by this session's tag where it died
        before the driver heard of its run)."""
        if not self.tracking_uri:
            return
        try:
            self.run_id = self.run_id or self._find_run()
            if self.run_id is None:
                return
            from mlflow.tracking import MlflowClient

            client = MlflowClient(self.tracking_uri)
            if client.get_run(self.run_id).info.status == "RUNNING":
                client.set_terminated(self.run_id, status)
        except Exception as e:  # noqa: BLE001 - best effort on the way out
            log.warning("could not mark run %s %s: %s", self.run_id, status, e)

    def finish(self) -> Result:
        summary = self._call("finish")
        self.finished = True
        weights = self._call("weights")
        states = self._call("client_states")
        unsaved = summary.get("unsaved")
        if unsaved:
            from safetensors.numpy import save_file

            where = Path(UNSAVED_DIR) / (summary["run_id"] or "run")
            where.mkdir(parents=True, exist_ok=True)
            named = self._call("named_weights")
            save_file({k: np.ascontiguousarray(v) for k, v in named.items()}, where / WEIGHTS)
            unsaved += f"; weights saved to {where / WEIGHTS} instead"
            log.warning(unsaved)
        return Result(
            metrics=summary["metrics"],
            history=summary["history"],
            run_id=summary["run_id"],
            weights_digest=summary["weights_digest"],
            config=self.cfg,
            tracking_uri=self.tracking_uri,
            clients=summary["clients"],
            weights=np.array(weights),
            client_states=states,
            unsaved=unsaved,
            state_store=summary.get("state_store"),
            plan=self.plan.describe(),
        )

    def _end_own_workers(self) -> None:
        workers, self._own_workers = self._own_workers, []
        if not workers:
            return
        import ray

        for worker in workers:
            with contextlib.suppress(Exception):  # best effort: it may have ended already
                ray.kill(worker)

    def close(self) -> None:
        """Stop the run's actors; a run not finished is marked KILLED in MLflow (resumable)."""
        atexit.unregister(self.close)
        here, self.here = getattr(self, "here", None), None
        if here is not None:
            try:
                here.close()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        actor = getattr(self, "actor", None)
        if actor is not None:
            import ray

            try:
                ray.get(actor.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
            ray.kill(actor)
            self.actor = None
        self._end_own_workers()
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False


RoundCallback = Callable[[dict[str, float]], None]


def run(
    config: str | Path | Mapping[str, Any] | RunConfig | None = None,
    overrides: Iterable[str] = (),
    *,
    resume: str | os.PathLike | ResumeSource | None = None,
    force: bool = False,
    address: str | None = None,
    on_round: RoundCallback | None = None,
    on_start: Callable[[RunSession], None] | None = None,
    plan: RunPlan | None = None,
    trust_modules: bool = False,
) -> Result:
    """Run one simulation to the end. ``config`` is a YAML path, a dict or a ``RunConfig``.

    The config is validated (overrides included) before Ray starts. ``on_round`` sees each round's
    metrics (the CLI draws its progress bar with it); ``on_start`` gets the ``RunSession`` once it
    is up (its ``run_id`` and ``round`` say where a stopped run can resume). ``resume`` continues
    a run from its last checkpoint: an MLflow run id (reopened; its metrics continue at the next
    round) or a checkpoint directory; ``config`` is then optional (default: the checkpoint's, with
    ``overrides`` applied) and must match the checkpoint's. An interrupted run is marked KILLED,
    a failed one FAILED; both can be resumed. ``plan``: the run's plan, resolved already
    (``raysim.launch.plan.plan_run``; the CLI prints it for ``--dry-run``), instead of the above.
    ``trust_modules``: import the modules that a checkpoint's config names (refused otherwise).
    """
    if plan is not None:
        return _carry_out(RunSession(address=address, plan=plan), on_round, on_start)
    if resume is not None and not isinstance(resume, ResumeSource):
        resume = prepare_resume(resume, config, overrides, force=force, trust_modules=trust_modules)
    if resume is not None:
        cfg = resume.config
    elif config is None:
        raise ConfigError("run() needs a config (or resume=RUN_ID)")
    else:
        cfg = load_config(config, overrides)
    return _carry_out(RunSession(cfg, address=address, resume=resume), on_round, on_start)


def _carry_out(
    session: RunSession,
    on_round: RoundCallback | None,
    on_start: Callable[[RunSession], None] | None,
) -> Result:
    """Step a started session to its end; a stopped run is marked KILLED, a failed one FAILED."""
    if on_start is not None:
        on_start(session)
    try:
        for metrics in session.rounds():
            if on_round is not None:
                on_round(metrics)
        return session.finish()
    except (KeyboardInterrupt, SystemExit):
        session.stop()
        raise
    except BaseException:
        session.fail("FAILED")
        raise
    finally:
        session.close()
