"""Whether a run needs Ray: ``runtime: auto`` runs it in the caller's process where Ray would add
processes and a link but nothing that runs in parallel.

A run on CPUs whose pool is one worker, or whose round's clients train as one group (batched
execution, ``clients.per_round`` ≤ ``workers.group_size``), trains one group at a time whatever
the pool; Ray would put the coordinator and the workers in processes of their own (seconds to
start on a small machine, a round trip per batch) for nothing that overlaps. Such a run is built
in the caller's process instead: the same coordinator, client runner and MLflow writer as in the
actors (``raysim.actors.local`` is the same core), so results are bit-identical either way and a
run started here resumes on a cluster and back (``runtime`` is free across a resume). Whatever
Ray adds that a run asks for keeps it on Ray: workers that train side by side (an explicit
``workers.count`` above 1, or a pool for a round of several groups), GPUs (asked for, or merely
visible: Ray keeps them from CPU workers, a run here would use them), a named cluster, Ray
already running in the process (a notebook's, a test's, a Tune trial's), injected faults,
per-client actors, or a ``workers.transport`` other than ``auto``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from raysim.config import ConfigError, RunConfig
from raysim.launch.private_ray import ray_address


def ray_is_up() -> bool:
    """Ray is initialized in this process (checked without importing it)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def gpus_visible() -> bool:
    """Whether this process could reach a GPU (checked without importing torch or Ray). Ray
    hides the GPUs from an actor that asks for none, so its CPU workers train on the CPU; a run
    in this process would find the GPU (``model.device: auto``) and give other bits."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"))


def auto_prefers_ray() -> str | None:
    """Why ``runtime: auto`` keeps a run that could go without Ray on it anyway (``local``
    does not): Ray already up in this process, or a GPU that a run here would take."""
    if ray_is_up():
        return "Ray is already running in this process"
    if gpus_visible():
        return "this machine has a GPU, which Ray keeps from workers that ask for none"
    return None


def coordinator_refusal(cfg: RunConfig) -> str | None:
    """Why the caller's process may not run ``cfg``'s coordinator; None where it may (its own
    actor gets GPUs, and a fault that kills it must not kill the caller)."""
    if cfg.coordinator.num_gpus:
        return "it asks for GPUs (coordinator.num_gpus)"
    if cfg.faults.kill_coordinator is not None:
        return "it injects a process fault (faults.kill_coordinator)"
    return None


def worker_refusal(cfg: RunConfig, num_workers: int, coordinator_here: bool = True) -> str | None:
    """Why the process that runs ``cfg``'s coordinator may not also train its clients; None
    where it may: one pooled worker, on CPUs, that no fault kills, beside a coordinator without
    GPUs (and, ``coordinator_here``, one that may run in the caller's process)."""
    w = cfg.workers
    if w.count == "per_client":
        return "workers.count=per_client starts one actor per client"
    if num_workers != 1:
        return f"its pool is {num_workers} workers"
    if w.num_gpus or cfg.coordinator.num_gpus:
        return "it asks for GPUs (workers.num_gpus / coordinator.num_gpus)"
    if cfg.faults.kill_worker is not None:
        return "it injects a process fault (faults.kill_worker)"
    return coordinator_refusal(cfg) if coordinator_here else None


def needs_ray(
    cfg: RunConfig, address: str | None = None, resources: Mapping[str, float] | None = None
) -> str | None:
    """Why ``cfg`` needs Ray, in words; None where it runs as well in the caller's process
    (``auto_prefers_ray`` adds the reasons of ``runtime: auto`` alone). ``resources``: what
    the plan found here (``raysim.launch.resources.local_resources``, one CPU count), which
    sizes the pool a run on Ray would have; counted here where not given."""
    from raysim.launch.resources import local_resources, plan_pool_size

    w = cfg.workers
    target = ray_address(address)
    if target != "local":
        return f"it runs on the Ray cluster at {target}"
    refusal = worker_refusal(cfg, 1)  # what a one-worker run here cannot do
    if refusal:
        return refusal
    if w.transport != "auto":
        return f"workers.transport={w.transport} names a link between Ray actors"
    if isinstance(w.count, int) and w.count > 1:
        return f"workers.count={w.count} asks for {w.count} worker actors"
    cpus = (local_resources() if resources is None else resources).get("CPU", 1.0)
    workers = plan_pool_size(cfg, {"CPU": float(cpus), "GPU": 0.0})
    from raysim.actors.jobs import group_count  # numpy only: no Ray

    groups = group_count(cfg.clients.per_round, cfg.group_size())
    if workers > 1 and groups > 1:
        return (
            f"a round trains its clients in {groups} groups, which {workers} workers "
            f"(workers.count=auto on {cpus:g} CPUs) run side by side"
        )
    return None


def runs_without_ray(
    cfg: RunConfig, address: str | None = None, resources: Mapping[str, float] | None = None
) -> bool:
    """Whether ``cfg`` runs in the caller's process (``choose_runtime``)."""
    return choose_runtime(cfg, address, resources)[0]


def choose_runtime(
    cfg: RunConfig, address: str | None = None, resources: Mapping[str, float] | None = None
) -> tuple[bool, str]:
    """Whether ``cfg`` runs in the caller's process, and why, in words (``runtime``: ``auto``
    decides by ``needs_ray`` and ``auto_prefers_ray``; ``local`` insists, and a config that
    needs Ray is refused naming why; ``ray`` asks for Ray)."""
    if cfg.runtime == "ray":
        return False, "runtime=ray"
    why = needs_ray(cfg, address, resources)
    if why is None and cfg.runtime == "auto":
        why = auto_prefers_ray()
    if cfg.runtime == "local" and why is not None:
        raise ConfigError(
            f"runtime=local runs the whole run in this process without Ray, but {why}; set "
            "runtime=auto (or ray)"
        )
    if why is not None:
        return False, why
    if cfg.runtime == "local":
        return True, "runtime=local"
    return True, "runtime=auto: Ray would add processes and nothing that runs side by side"
