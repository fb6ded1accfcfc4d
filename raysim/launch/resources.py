"""Resource planning: the bundles a run needs, shared by ``RunSession``, Ray Tune and clusters.

``plan_resources(cfg, cluster)`` checks a config against a cluster's resources (before any actor
starts) and returns a ``ResourcePlan``: the coordinator's bundle (``coordinator.num_cpus`` /
``num_gpus``, fractions allowed; it computes for server-side methods) and one bundle per worker.
A Ray Tune trial reserves ``plan.bundles()`` as its placement group; a cluster launch sizes nodes
from ``plan.totals()``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim.config import RunConfig

#: ``per_client`` mode starts one actor process per client (seconds to start, hundreds of MB each):
#: at most this many per CPU of the cluster (at least ``PER_CLIENT_MIN``), and never above the cap.
PER_CLIENT_PER_CPU, PER_CLIENT_MIN, PER_CLIENT_LIMIT = 4, 8, 256


class ResourceError(RuntimeError):
    """The requested workers cannot be placed on this cluster."""


def plan_pool_size(cfg: RunConfig, resources: dict[str, float]) -> int:
    """Number of worker actors for ``cfg`` on a cluster with ``resources``; raises if impossible."""
    w, c = cfg.workers, cfg.coordinator
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    if w.num_gpus > 0 and gpus == 0:
        raise ResourceError(
            f"workers.num_gpus={w.num_gpus} but the Ray cluster has no GPU; set workers.num_gpus=0 "
            "or declare logical GPUs (ray start --num-gpus N)"
        )
    if w.num_gpus > 1 and not float(w.num_gpus).is_integer():
        raise ResourceError(f"workers.num_gpus={w.num_gpus}: above 1 it must be a whole number")
    free_cpu, free_gpu = cpus - c.num_cpus, gpus - c.num_gpus
    if free_cpu < 0 or free_gpu < 0:
        raise ResourceError(
            f"the coordinator asks for {c.num_cpus} CPUs / {c.num_gpus} GPUs; the cluster has "
            f"{cpus} CPUs / {gpus} GPUs"
        )
    fit = math.inf
    if w.num_cpus > 0:
        fit = min(fit, math.floor(free_cpu / w.num_cpus + 1e-9))
    if w.num_gpus > 0:
        fit = min(fit, math.floor(free_gpu / w.num_gpus + 1e-9))
    if w.count == "per_client":
        n = cfg.clients.num
        limit = min(PER_CLIENT_LIMIT, max(PER_CLIENT_MIN, int(PER_CLIENT_PER_CPU * cpus)))
        if n > limit:
            raise ResourceError(
                f"workers.count=per_client would start {n} actor processes, one per client "
                f"(each takes seconds to start and hundreds of MB); {cpus:g} CPUs allow {limit} "
                f"({PER_CLIENT_PER_CPU} per CPU). Use workers.count=auto: a pool of workers gives "
                "the same results"
            )
    elif w.count == "auto":
        n = int(max(1, min(fit, cfg.clients.per_round)))
    else:
        n = int(w.count)
    if n > fit:
        raise ResourceError(
            f"{n} worker(s) × ({w.num_cpus} CPU, {w.num_gpus} GPU) do not fit the cluster "
            f"({free_cpu:g} CPUs, {free_gpu:g} GPUs free after the coordinator): at most {fit} "
            "fit; lower workers.count, workers.num_cpus or workers.num_gpus"
        )
    return n


@dataclass(frozen=True)
class ResourcePlan:
    """What one run reserves: a coordinator bundle and ``num_workers`` identical worker bundles."""

    coordinator: dict[str, float]
    worker: dict[str, float]
    num_workers: int

    def bundles(self) -> list[dict[str, float]]:
        """Placement-group bundles (coordinator first); zero entries dropped, and a bundle that
        asks for nothing gets a token 0.001 CPU (Ray refuses empty bundles)."""

        def clean(b: dict[str, float]) -> dict[str, float]:
            out = {k: v for k, v in b.items() if v > 0}
            return out or {"CPU": 0.001}

        return [clean(self.coordinator)] + [clean(self.worker)] * self.num_workers

    def totals(self) -> dict[str, float]:
        return {
            k: self.coordinator.get(k, 0.0) + self.num_workers * self.worker.get(k, 0.0)
            for k in ("CPU", "GPU")
        }

    def describe(self) -> dict[str, Any]:
        return {"coordinator": self.coordinator, "worker": self.worker, "workers": self.num_workers}


def plan_resources(cfg: RunConfig, resources: dict[str, float]) -> ResourcePlan:
    """The bundles ``cfg`` needs on a cluster with ``resources`` (``ray.cluster_resources()``);
    raises ``ResourceError`` naming what does not fit."""
    n = plan_pool_size(cfg, resources)
    c, w = cfg.coordinator, cfg.workers
    return ResourcePlan(
        {"CPU": float(c.num_cpus), "GPU": float(c.num_gpus)},
        {"CPU": float(w.num_cpus), "GPU": float(w.num_gpus)},
        n,
    )


def local_resources() -> dict[str, float]:
    """What a private local Ray will have: ``cpu_count`` (raysim passes it to ``ray.init``, so
    Ray counts the same) and the CUDA GPUs Ray itself finds (NVML, limited to
    ``CUDA_VISIBLE_DEVICES``); torch counts them where Ray's detection is not there, so the
    driver imports torch only then."""
    return {"CPU": float(cpu_count()), "GPU": float(_visible_gpus())}


#: where the cgroup file system is mounted (a test points it at a fake one)
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_count() -> int:
    """The CPUs this process may use: those it may run on (``sched_getaffinity``: a container's
    cpuset, ``taskset``), limited by its cgroup's CPU quota (``docker --cpus``, a Kubernetes
    limit) rounded down, at least 1. The one count every choice uses: whether a run needs Ray,
    the size of its pool, the CPUs of a private Ray. Imports nothing heavy (no Ray)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = cpu_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota + 1e-9)))
    return max(1, cpus)


def cpu_quota(root: Path | None = None) -> float | None:
    """This process's cgroup CPU quota in CPUs (quota / period), None where it has none:
    cgroup v2's ``cpu.max`` in the process's own group (else the root's), or v1's
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``."""
    root = CGROUP_ROOT if root is None else root
    for path in (root / _own_cgroup() / "cpu.max", root / "cpu.max"):
        try:
            quota, period = path.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        return None if quota == "max" else _ratio(quota, period)
    try:
        quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
        period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = float(quota), float(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _own_cgroup() -> str:
    """This process's cgroup v2 path (``0::/PATH`` in ``/proc/self/cgroup``), relative."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip().lstrip("/")
    except OSError:
        pass
    return ""


def _visible_gpus() -> int:
    """The CUDA GPUs this process may use: NVML's count (Ray's own detection), limited to
    ``CUDA_VISIBLE_DEVICES``. Ray counts 0 on any NVML error, and every GPU run would then be
    refused: where NVML is there but fails, torch counts them. No NVIDIA driver at all is 0,
    without importing torch (the driver of a run on the CPU imports none)."""
    try:
        import ray._private.thirdparty.pynvml as pynvml
        from ray._private.accelerators import NvidiaGPUAcceleratorManager as nvidia
    except ImportError:  # another Ray layout: ask CUDA through torch
        return _torch_gpus()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:  # no NVIDIA driver here: no GPUs
        return 0
    except pynvml.NVMLError:  # the driver is there but NVML fails: torch may still see them
        return _torch_gpus()
    try:
        gpus = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError:
        return _torch_gpus()
    finally:
        pynvml.nvmlShutdown()
    visible = nvidia.get_current_process_visible_accelerator_ids()
    return gpus if visible is None else min(gpus, len(visible))


def _torch_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA: no GPUs
        return 0
