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
    """What a private local Ray will have: the CPUs Ray counts and the CUDA GPUs Ray itself
    finds (NVML, limited to ``CUDA_VISIBLE_DEVICES``); torch counts them where Ray's detection
    is not there, so the driver imports torch only then."""
    return {"CPU": float(_ray_cpus()), "GPU": float(_visible_gpus())}


def _ray_cpus() -> int:
    """The CPUs a private Ray counts (its own count: container limits included), so that a plan
    made before Ray starts is the one Ray's resources give."""
    try:
        from ray._private.utils import get_num_cpus
    except ImportError:  # another Ray layout
        return os.cpu_count() or 1
    return int(get_num_cpus())


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
