"""The Python API users import: ``run(config, overrides) -> Result`` and the ``RunSession``
driver loop (``raysim.launch.session``), the plan (``raysim.launch.plan``) and the checks and
helpers that come with them."""

from __future__ import annotations

from raysim.launch.plan import RunPlan, plan_run
from raysim.launch.private_ray import ClusterError, check_reachable, ensure_ray, ray_address
from raysim.launch.resources import local_resources
from raysim.launch.session import (
    CoordinatorLost,
    Result,
    RunSession,
    can_host_coordinator,
    can_host_worker,
    preflight,
    run,
)

__all__ = [
    "ClusterError",
    "CoordinatorLost",
    "Result",
    "RunPlan",
    "RunSession",
    "can_host_coordinator",
    "can_host_worker",
    "check_reachable",
    "ensure_ray",
    "local_resources",
    "plan_run",
    "preflight",
    "ray_address",
    "run",
]
