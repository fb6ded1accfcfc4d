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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from raysim.config import ConfigError, RunConfig
from raysim.launch.private_ray import ray_address

if TYPE_CHECKING:
    from raysim.launch.resources import ResourcePlan
    from raysim.launch.sizes import SizeReport
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
        return replace(self, resources=dict(resources), pool=_pool(self.cfg, resources))

    def describe(self) -> str:
        """The plan in a few lines: ``raysim run --dry-run`` prints them, ``Result.plan`` keeps
        them."""
        cfg = self.cfg
        lines = [f"{cfg.run_name()} · {cfg.rounds} rounds · {cfg.clients.num} clients"]
        if self.resume is not None:
            where = self.resume.run_id or self.resume.dir
            lines.append(f"resume: {where} at round {self.resume.round}")
        if self.local:
            lines.append("runtime: this process, without Ray (runtime=ray to start Ray)")
        else:
            ray = "a private local Ray" if self.target == "local" else f"Ray at {self.target}"
            lines.append(f"runtime: {ray}" + (f" (on Ray: {self.why_ray})" if self.why_ray else ""))
        lines.append(f"coordinator: {self._coordinator()}")
        lines.append(f"workers: {self._workers()}")
        group = cfg.group_size()
        if group == 1:
            lines.append("clients: one after another on each worker")
        elif cfg.algorithm.params.trains_together:
            lines.append("clients: a round's clients train together (the method couples them)")
        else:
            lines.append(f"clients: batched, up to {group} at a time on each worker")
        lines.append(f"tracking: {self.tracking_uri or 'off'}")
        if self.sizes is not None:
            lines.append(f"sizes: {self.sizes.describe()}")
        from raysim.security.policy import audit_plan_line

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
    resources: dict[str, float] | None = None,
    coordinator_here: bool = False,
    worker_here: bool = False,
    placed: bool = False,
) -> RunPlan:
    """Resolve a run's plan (``RunSession``'s arguments, which it documents). ``placed``: the
    caller has placed the run already (a Tune trial handing over its workers), so it runs on
    Ray. Raises ``ConfigError`` for a placement the config cannot take, and for sizes this
    machine cannot hold (``raysim.launch.sizes``), before anything starts or is allocated."""
    from raysim.launch.without_ray import (
        auto_prefers_ray,
        coordinator_refusal,
        needs_ray,
        runs_without_ray,
        worker_refusal,
    )
    from raysim.state.checkpoint import ResumeSource, prepare_resume

    if resume is not None and not isinstance(resume, ResumeSource):
        resume = prepare_resume(resume, cfg, force=force)
    if resume is not None:
        cfg = resume.config
    if cfg is None:
        raise ConfigError("RunSession needs a config or a run to resume")
    uri = tracking_uri_of(cfg, resume)
    target = ray_address(address)
    caller_placed = coordinator_here or worker_here or resources is not None or placed
    if not caller_placed and runs_without_ray(cfg, address):
        sizes = _sizes(cfg, 1, True, uri)
        return RunPlan(cfg, resume, uri, True, target, None, True, True, None, None, sizes)
    why = None
    if cfg.runtime == "auto" and not caller_placed:
        why = needs_ray(cfg, address) or auto_prefers_ray()
    here = coordinator_here and coordinator_refusal(cfg) is None
    if resources is None:
        resources = _resources_before_start(target)
    pool = None if resources is None else _pool(cfg, resources)
    in_process = cfg.workers.transport == "in_process"
    if pool is not None:
        n = pool.num_workers
        if worker_here and not (here and worker_refusal(cfg, n) is None):
            raise ConfigError(
                "tune.worker=here trains a trial's one worker in the trial's process: every "
                "trial needs workers.count=1 on CPUs (workers.num_gpus=0), no "
                "faults.kill_worker or kill_coordinator and coordinator.num_gpus=0; set "
                "tune.worker=actor to sweep this config"
            )
        if in_process and worker_refusal(cfg, n, here) is not None:
            raise ConfigError(
                "workers.transport=in_process trains the run's one worker in the "
                f"coordinator's process: it needs workers.count=1 (here {n} workers) on CPUs "
                "(workers.num_gpus=0), coordinator.num_gpus=0 and no faults.kill_worker; set "
                "workers.transport=auto"
            )
    sizes = _sizes(cfg, 1 if pool is None else pool.num_workers, target == "local", uri)
    worker_here = worker_here or in_process
    return RunPlan(cfg, resume, uri, False, target, why, here, worker_here, resources, pool, sizes)


def _sizes(cfg: RunConfig, workers: int, here: bool, uri: str | None) -> SizeReport:
    """The run's sizes, held to this machine where the run is ``here`` (not on a named
    cluster); raises ``ConfigError`` in one line for what it cannot hold."""
    from raysim.launch.sizes import size_report

    return size_report(cfg, workers, here, uri)


def _resources_before_start(target: str) -> dict[str, float] | None:
    """What the run may use, known before Ray starts: Ray's own view where it is up in this
    process, this machine's where a private Ray will start; None on a named cluster."""
    from raysim.launch.without_ray import ray_is_up

    if ray_is_up():
        import ray

        return dict(ray.cluster_resources())
    if target == "local":
        from raysim.launch.resources import local_resources

        return local_resources()
    return None
