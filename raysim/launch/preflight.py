"""The checks a planned run passes before anything starts (run once, by ``plan_run``): the files
and folders its config names are on this machine (a private Ray's run; ``raysim.launch.inputs``),
a named cluster answers, and no other live run writes its ``checkpoint.dir``. Whether its workers
fit was settled when the plan sized the pool."""

from __future__ import annotations

from typing import Protocol

from raysim.config import RunConfig


class Planned(Protocol):
    """What the checks read of a ``RunPlan`` (``raysim.launch.plan``, which calls them)."""

    cfg: RunConfig
    target: str
    named_by: str


def preflight(plan: Planned) -> None:
    """Refuse ``plan`` before Ray starts if it cannot start: ``MissingInput`` (a named file that
    is not here; on a cluster a file may be on the nodes that read it, so only a private Ray's
    run is checked), ``ClusterError`` (a named cluster that does not answer) or
    ``CheckpointDirBusy`` (its coordinator holds the folder's lock)."""
    from raysim.launch.inputs import check_inputs
    from raysim.launch.private_ray import check_reachable

    cfg = plan.cfg
    if plan.target == "local":
        check_inputs(cfg)
    else:
        check_reachable(plan.target, named_by=plan.named_by or "--address")
    if cfg.checkpoint.dir:
        from raysim.state.checkpoint_files import check_free

        check_free(cfg.checkpoint.dir)
