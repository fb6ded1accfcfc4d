"""One run's plan, resolved in one place: what it resumes from, where its processes are, the
resources it takes, its pool of workers and where each trains, and its MLflow store.

``plan_run`` reads the config, the caller's placement (a Tune trial's) and the machine or
cluster, and decides everything ``RunSession`` then carries out: the session asks nothing
again. ``RunPlan.describe`` is what ``raysim run --dry-run`` prints and what the run records
(``Result.plan``), so a test can hold the two to each other. On a named cluster the pool is
known once the driver has connected (``RunPlan.on_cluster``); everything else is known before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from raysim.config import ConfigError, RunConfig
from raysim.launch.private_ray import ray_address

if TYPE_CHECKING:
    from raysim.launch.resources import ResourcePlan
    from raysim.launch.sizes import SizeReport, StoreChoice
    from raysim.state.checkpoint import ResumeSource


@dataclass(frozen=True)
class RunPlan:
    """What a run does before its first round, decided before anything starts.

    ``local``: the whole run in the caller's process without Ray (``runtime``,
    ``raysim.launch.without_ray``); else on Ray at ``target`` (``"local"``: a private Ray this
    process
    starts, or the one already up in it). ``why_ray``: why ``runtime: auto`` keeps the run on
    Ray. ``coordinator_here``: the coordinator runs in the caller's process (a run without Ray, a
    Tune trial's), else in its own actor; ``worker_here``: the clients train in the
    coordinator's process (no worker actor). ``resources``: what the run may use (None on a named
    cluster until connected); ``pool``: the coordinator's and the workers' bundles and the number
    of workers (None until ``resources`` are known). ``sizes``: the run's memory, checkpoint and
    personal-state store, estimated from the config and held to this machine
    (``raysim.launch.sizes``).
    """

    cfg: RunConfig
    resume: ResumeSource | None
    tracking_uri: str | None
    local: bool
    target: str
    why_ray: str | None
    coordinator_here: bool
    worker_here: bool
    resources: dict[str, float] | None
    pool: ResourcePlan | None
    sizes: SizeReport | None = None
    #: where ``target`` came from: ``--address``, ``RAY_ADDRESS`` or "" (a private Ray)
    named_by: str = ""
    #: why the run is where it is (``runtime``: in this process or on Ray; ``pool``: its size)
    why: Mapping[str, str] = field(default_factory=dict)
    #: ``raysim.launch.preflight`` passed (``plan_run`` runs it once)
    checked: bool = False

    @property
    def pool_size(self) -> int:
        """The number of workers (1 for a run without Ray); raises before ``on_cluster``."""
        if self.local:
            return 1
        if self.pool is None:
            raise RuntimeError("the pool of a run on a named cluster is known once connected")
        return self.pool.num_workers

    def on_cluster(self, resources: dict[str, float]) -> RunPlan:
        """This plan with the cluster's ``resources`` (``ray.cluster_resources()``) and the pool
        they give; the plan itself where they were known already."""
        if self.local or self.pool is not None:
            return self
        pool = _pool(self.cfg, resources)
        why = {**self.why, "pool": _pool_why(self.cfg, pool, resources)}
        return replace(self, resources=dict(resources), pool=pool, why=why)

    def describe(self) -> str:
        """The plan in a few lines: ``raysim run --dry-run`` prints them, ``Result.plan`` keeps
        them."""
        cfg = self.cfg
        lines = [f"{cfg.run_name()} · {cfg.rounds} rounds · {cfg.clients.num} clients"]
        if self.resume is not None:
            where = self.resume.run_id or self.resume.dir
            lines.append(f"resume: {where} at round {self.resume.round}")
        why = self.why.get("runtime")
        if self.local:
            why = f"{why}; runtime=ray to start Ray" if why else "runtime=ray to start Ray"
            lines.append(f"runtime: this process, without Ray ({why})")
        else:
            ray = "a private local Ray" if self.target == "local" else f"Ray at {self.target}"
            lines.append(f"runtime: {ray}" + (f" (on Ray: {why})" if why else ""))
        lines.append(f"coordinator: {self._coordinator()}")
        workers = self._workers()
        if "pool" in self.why and not self.local:
            workers += f" ({self.why['pool']})"
        lines.append(f"workers: {workers}")
        lines.append(f"clients: {_clients(cfg)}")
        lines.append(f"tracking: {self.tracking_uri or 'off'}")
        if self.sizes is not None:
            lines.append(f"sizes: {self.sizes.describe()}")
            lines += self.sizes.store_lines()  # clients.state.store: auto's choice
        from raysim.privacy.settings import privacy_plan_line
        from raysim.robust.settings import robust_plan_line
        from raysim.security.policy import audit_plan_line

        lines.append(f"privacy: {privacy_plan_line(cfg)}")
        if cfg.devices.enabled:
            from raysim.devices.build import plan_line

            lines.append(f"devices: {plan_line(cfg)}")
        if robust := robust_plan_line(cfg):
            lines.append(f"robust: {robust}")
        lines.append(audit_plan_line(cfg))
        return "\n".join(lines)

    def _coordinator(self) -> str:
        if self.coordinator_here:
            return "in this process"
        bundle = "?" if self.pool is None else _bundle(self.pool.coordinator)
        return f"its own actor ({bundle})"

    def _workers(self) -> str:
        if self.local:
            return "1, in this process"
        if self.pool is None:
            return "a pool sized to the cluster once connected"
        n = self.pool.num_workers
        if self.worker_here:
            return f"{n}, in the coordinator's process"
        per = " (one per client)" if self.cfg.workers.count == "per_client" else ""
        return f"{n} actor{'s' if n != 1 else ''} of {_bundle(self.pool.worker)}{per}"


def size_on_cluster(plan: RunPlan) -> RunPlan:
    """``plan`` with its named cluster's pool (``RunPlan.on_cluster``), for a dry run to print
    the plan the run will follow: the driver connects to read the cluster's resources and
    disconnects; nothing is started on it. The plan itself where its pool is known."""
    if plan.local or plan.pool is not None:
        return plan
    import ray

    from raysim.launch.private_ray import ensure_ray

    started = ensure_ray(target=plan.target)
    try:
        return plan.on_cluster(ray.cluster_resources())
    finally:
        if started:
            ray.shutdown()


def _clients(cfg: RunConfig) -> str:
    """How a worker trains its clients, as far as the config tells: ``workers.execution: auto``
    batches only where the built model allows, which the worker checks as it starts."""
    group = cfg.group_size()
    if group == 1:
        return "one after another on each worker"
    if cfg.algorithm.params.trains_together:
        return "a round's clients train together (the method couples them)"
    if cfg.workers.execution == "batched":
        return f"batched, up to {group} at a time on each worker (workers.execution=batched)"
    return (
        f"batched, up to {group} at a time on each worker, where the built model allows "
        "(workers.execution=auto: the worker checks it as it starts, else one after another)"
    )


def _pool_why(cfg: RunConfig, pool: ResourcePlan, resources: Mapping[str, float]) -> str:
    """Why the pool has its size, in words."""
    w = cfg.workers
    if w.count == "per_client":
        return "workers.count=per_client: one per client"
    if w.count != "auto":
        return f"workers.count={w.count}"
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    return (
        f"workers.count=auto: at most clients.per_round={cfg.clients.per_round}, as many as "
        f"{cpus:g} CPUs / {gpus:g} GPUs hold"
    )


def _bundle(bundle: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in bundle.items() if v) or "no CPU"


def _pool(cfg: RunConfig, resources: dict[str, float]) -> ResourcePlan:
    from raysim.launch.resources import plan_resources

    return plan_resources(cfg, dict(resources))


def tracking_uri_of(cfg: RunConfig, resume: ResumeSource | None) -> str | None:
    """The run's MLflow store: a resumed run's own, else ``tracking.uri`` or the default."""
    if not cfg.tracking.enabled:
        return None
    from raysim.tracking.store import default_tracking_uri

    return (resume.tracking_uri if resume else None) or cfg.tracking.uri or default_tracking_uri()


def plan_run(
    cfg: RunConfig | None = None,
    address: str | None = None,
    *,
    resume: str | os.PathLike | ResumeSource | None = None,
    force: bool = False,
    resources: Mapping[str, float] | None = None,
    coordinator_here: bool = False,
    worker_here: bool = False,
    placed: bool = False,
    check: bool = True,
) -> RunPlan:
    """Resolve a run's plan (``RunSession``'s arguments, which it documents): the only place
    that resolves the Ray address, counts this machine's resources, sizes the pool and chooses
    the runtime. ``placed``: the caller has placed the run already (a Tune trial handing over
    its workers), so it runs on Ray. ``check``: run ``raysim.launch.preflight`` once (a run the
    caller placed was checked where it was placed). Raises ``ConfigError`` for a placement the
    config cannot take, and for sizes this machine cannot hold (``raysim.launch.sizes``),
    before anything starts or is allocated."""
    from raysim.launch.store_choice import choose_store
    from raysim.launch.without_ray import choose_runtime, coordinator_refusal, worker_refusal
    from raysim.state.checkpoint import ResumeSource, prepare_resume

    if resume is not None and not isinstance(resume, ResumeSource):
        resume = prepare_resume(resume, cfg, force=force)
    if resume is not None:
        cfg = resume.config
    if cfg is None:
        raise ConfigError("RunSession needs a config or a run to resume")
    uri = tracking_uri_of(cfg, resume)
    target = ray_address(address)
    cfg, store = choose_store(cfg, target == "local")  # clients.state.store: auto, decided here
    named_by = "" if target == "local" else ("--address" if address else "RAY_ADDRESS")
    caller_placed = coordinator_here or worker_here or resources is not None or placed
    why: dict[str, str] = {}
    if not caller_placed:  # this machine's CPUs decide (its GPUs are counted only for Ray)
        cpus = _resources_before_start(target, gpus=False)
        local, why["runtime"] = choose_runtime(cfg, target, cpus)
        if local:
            sizes = _sizes(cfg, 1, True, uri, store)
            plan = RunPlan(
                cfg, resume, uri, True, target, None, True, True, None, None, sizes, "", why
            )
            return _checked(plan) if check else plan
    else:
        why["runtime"] = "placed by its caller (a Tune trial)"
    why_ray = why["runtime"] if cfg.runtime == "auto" and not caller_placed else None
    here = coordinator_here and coordinator_refusal(cfg) is None
    resources = _resources_before_start(target) if resources is None else dict(resources)
    pool = None if resources is None else _pool(cfg, resources)
    if pool is not None:
        why["pool"] = _pool_why(cfg, pool, resources)
    in_process = cfg.workers.transport == "in_process"
    if pool is not None:
        n = pool.num_workers
        if worker_here and not (here and worker_refusal(cfg, n) is None):
            raise ConfigError(TRIAL_WORKER_HERE)
        if in_process and worker_refusal(cfg, n, here) is not None:
            raise ConfigError(
                "workers.transport=in_process trains the run's one worker in the "
                f"coordinator's process: it needs workers.count=1 (here {n} workers) on CPUs "
                "(workers.num_gpus=0), coordinator.num_gpus=0 and no faults.kill_worker; set "
                "workers.transport=auto"
            )
    sizes = _sizes(cfg, 1 if pool is None else pool.num_workers, target == "local", uri, store)
    worker_here = worker_here or in_process
    plan = RunPlan(
        cfg,
        resume,
        uri,
        False,
        target,
        why_ray,
        here,
        worker_here,
        resources,
        pool,
        sizes,
        named_by,
        why,
    )
    return _checked(plan) if check and not caller_placed else plan


#: a Tune trial that trains its worker in its own process, for a config that cannot
TRIAL_WORKER_HERE = (
    "tune.worker=here trains a trial's one worker in the trial's process: every trial needs "
    "workers.count=1 on CPUs (workers.num_gpus=0), no faults.kill_worker or kill_coordinator "
    "and coordinator.num_gpus=0; set tune.worker=actor to sweep this config"
)


def _checked(plan: RunPlan) -> RunPlan:
    """``plan`` once ``raysim.launch.preflight`` has passed it."""
    from raysim.launch.preflight import preflight

    preflight(plan)
    return replace(plan, checked=True)


def _sizes(
    cfg: RunConfig, workers: int, here: bool, uri: str | None, store: StoreChoice | None = None
) -> SizeReport:
    """The run's sizes, held to this machine where the run is ``here`` (not on a named
    cluster); raises ``ConfigError`` in one line for what it cannot hold. ``store``: how
    ``clients.state.store: auto`` was decided (``raysim.launch.store_choice.choose_store``)."""
    from raysim.launch.sizes import size_report

    return size_report(cfg, workers, here, uri, store=store)


def _resources_before_start(target: str, gpus: bool = True) -> dict[str, float] | None:
    """What the run may use, known before Ray starts: Ray's own view where it is up in this
    process, this machine's where a private Ray will start (``local_resources``; without
    counting GPUs, which imports Ray's NVML binding, unless ``gpus``); None on a named
    cluster."""
    from raysim.launch.without_ray import ray_is_up

    if ray_is_up():
        import ray

        return dict(ray.cluster_resources())
    if target == "local":
        from raysim.launch.resources import cpu_count, local_resources

        return local_resources() if gpus else {"CPU": float(cpu_count()), "GPU": 0.0}
    return None
