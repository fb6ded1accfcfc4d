"""Where a Ray Tune sweep's trials run, decided by the rules every run follows: each trial is a
placement group (its own process, then the run's plan: the coordinator's bundle and one per
worker, ``raysim.launch.resources``), and the run inside a trial is planned by ``plan_run`` on
that group's share (``trial_plan``), the plan ``raysim tune --dry-run`` prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raysim.config import ConfigError, RunConfig

if TYPE_CHECKING:
    from raysim.launch.plan import RunPlan
    from raysim.sweeps.space import TuneSection

#: CPUs of a trial's own process (the first bundle of its placement group)
TRIAL_CPU = 0.1


@dataclass(frozen=True)
class SweepPlan:
    """A sweep's placement, decided before any trial starts: the Ray address (``target``), what
    the cluster has (``total``), each trial's bundles (pinned to the store's node where it must
    be, ``raysim.launch.placement.trial_pin``), whether a trial trains its one worker in its own
    process (``here``), and the plan of the run inside a trial (``trial``)."""

    target: str
    total: dict[str, float]
    bundles: list[dict[str, float]]
    here: bool
    trial: RunPlan


def plan_sweep(
    cfg: RunConfig,
    section: TuneSection,
    address: str | None,
    tracking_uri: str | None,
    dry_run: bool = False,
) -> SweepPlan:
    """The sweep's ``SweepPlan``. A dry run on a private Ray starts nothing and plans on this
    machine's resources (``local_resources``); otherwise Ray is started or joined here (a
    named cluster that does not answer fails in one line first)."""
    import ray

    # what planning a trial imports, imported before Ray is joined: in a Ray job's entrypoint
    # Ray may remove the job's copy of its working_dir once the driver joins (seen on a fresh
    # cluster within 3 s of ray.init), and a module first imported after that is not found
    import raysim.launch.plan  # noqa: F401
    import raysim.launch.preflight  # noqa: F401
    import raysim.launch.store_choice  # noqa: F401
    import raysim.state.checkpoint  # noqa: F401
    from raysim.launch.inputs import check_inputs
    from raysim.launch.placement import trial_pin
    from raysim.launch.private_ray import check_reachable, ensure_ray, ray_address
    from raysim.launch.resources import local_resources

    target = ray_address(address)
    private = target == "local" and not ray.is_initialized()
    if private:  # what ``preflight`` checks of a run: its files here, its checkpoint folder free
        check_inputs(cfg)
        if cfg.checkpoint.dir:
            from raysim.state.checkpoint_files import check_free

            check_free(cfg.checkpoint.dir)
        total = local_resources()
    elif not ray.is_initialized():
        check_reachable(target, named_by="--address" if address else "RAY_ADDRESS")
    if not (dry_run and private):
        ensure_ray(target=target, resources=total if private else None)
        total = {k: float(v) for k, v in ray.cluster_resources().items()}
    # the trial and its coordinator: by the store (nothing on one node, as without Ray yet)
    pin = {} if dry_run and private else trial_pin(cfg, tracking_uri)
    bundles = trial_bundles(cfg, total)
    here = trains_here(cfg, section, bundles, total, pinned=bool(pin))
    if here:
        bundles = worker_in_trial(bundles)
    trial = trial_plan(cfg, bundles, here)
    bundles = [{**b, **pin} if i < 2 else b for i, b in enumerate(bundles)]
    return SweepPlan(target, total, bundles, here, trial)


def trial_share(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """What the run inside a trial may use: its placement group's ``bundles``, less the
    ``TRIAL_CPU`` that the trial's own process takes from the first (which also holds the
    worker's share where the trial trains it, ``worker_in_trial``)."""
    share = {key: float(sum(b.get(key, 0.0) for b in bundles)) for key in ("CPU", "GPU")}
    share["CPU"] = max(0.0, share["CPU"] - TRIAL_CPU)
    return share


def trial_plan(cfg: RunConfig, bundles: Sequence[Mapping[str, float]], here: bool) -> RunPlan:
    """The plan of the run inside a trial placed as ``bundles``: ``plan_run`` with the
    coordinator in the trial's process, on the group's share, exactly as the trial plans it
    (``raysim.sweeps.trial.RunTrial``)."""
    from raysim.launch.plan import plan_run

    return plan_run(
        cfg,
        resources=trial_share(bundles),
        coordinator_here=True,
        worker_here=here,
        placed=True,
        check=False,
    )


def trains_here(
    cfg: RunConfig,
    section: TuneSection,
    bundles: list[dict[str, float]],
    total: Mapping[str, float],
    pinned: bool = False,
) -> bool:
    """Whether each trial trains its run's one worker in its own process (``tune.worker``), for
    a trial placed as ``bundles`` (``trial_bundles``: its process, the coordinator, the workers).

    ``auto`` does where a trial's process will serve a later trial (more trials than run side
    by side, Tune's ``reuse_actors``): the later trials then start without a new process or
    fresh imports. Where every trial has a fresh process, ``auto`` keeps the worker actor, whose
    imports run beside the trial process's on another core. Nor does it where the trial's own
    bundle is ``pinned`` to the head (``trial_pin``: a node-local store on a cluster): every
    trial would then train on the head, where worker actors go to any node."""
    from raysim.launch.without_ray import worker_refusal

    refusal = worker_refusal(cfg, len(bundles) - 2)
    if cfg.workers.transport == "in_process":  # the trial's process hosts its coordinator
        if section.worker == "actor" or refusal is not None:
            why = refusal or "tune.worker=actor asks for a worker actor"
            raise ConfigError(
                "workers.transport=in_process trains each trial's one worker in the trial's "
                f"process, but {why}: set workers.count=1 on CPUs (workers.num_gpus=0), "
                "coordinator.num_gpus=0, no faults.kill_worker or kill_coordinator, and "
                "tune.worker auto or here"
            )
        return True
    if section.worker == "actor" or refusal is not None:
        return False
    if section.worker == "here":
        return True
    trials, side_by_side = sweep_counts(section, bundles, total)
    return trials > side_by_side and not pinned


def worker_in_trial(bundles: list[dict[str, float]]) -> list[dict[str, float]]:
    """``bundles`` of a trial that trains its one worker itself (``trains_here``): the worker's
    share joins the first bundle, the trial's process; the totals are the same."""
    first, coordinator, worker = bundles
    merged = {**first}
    for key, amount in worker.items():
        merged[key] = merged.get(key, 0.0) + amount
    return [merged, coordinator]


def trial_bundles(cfg: RunConfig, total: Mapping[str, float]) -> list[dict[str, float]]:
    """One trial's placement group: its own process (Tune runs the trial on the first bundle
    with all of it), then the run's plan (the coordinator's bundle, one per worker). Refused,
    saying why, when one trial does not fit ``total``."""
    from raysim.launch.resources import ResourceError, plan_resources

    # what the run may plan on: all but the trial's own bundle (and the coordinator's minimum)
    share = {**total, "CPU": max(0.0, total.get("CPU", 0.0) - TRIAL_CPU - 0.001)}
    plan = plan_resources(cfg, share)
    bundles = [{"CPU": TRIAL_CPU}, *plan.bundles()]
    need = {r: sum(b.get(r, 0.0) for b in bundles) for r in ("CPU", "GPU")}
    if any(need[r] > total.get(r, 0.0) + 1e-9 for r in need):
        raise ResourceError(
            f"one trial needs {need['CPU']:g} CPUs / {need['GPU']:g} GPUs (its process, the "
            f"coordinator and {plan.num_workers} worker(s)); the cluster has "
            f"{total.get('CPU', 0):g} / {total.get('GPU', 0):g}: lower workers.count"
        )
    return bundles


def describe_sweep(
    cfg: RunConfig,
    section: TuneSection,
    bundles: list[dict[str, float]],
    total: Mapping,
    here: bool = False,
    trial: RunPlan | None = None,
) -> str:
    """One line: how many trials, what each takes, how many fit side by side, and where a
    trial's worker trains (``here``: ``trains_here``); then, given ``trial`` (``trial_plan``),
    where a trial's coordinator and workers run."""
    trials, side_by_side = sweep_counts(section, bundles, total)
    cpu = sum(b.get("CPU", 0.0) for b in bundles)
    gpu = sum(b.get("GPU", 0.0) for b in bundles)
    where = "its worker in its own process" if here else "its workers as actors"
    line = (
        f"dry run: {trials} trial(s) over {', '.join(section.space)} ({section.scheduler}, "
        f"{section.metric} {section.mode}); each takes {cpu:g} CPUs / {gpu:g} GPUs in "
        f"{len(bundles)} bundles, {where}, {side_by_side} side by side; nothing started"
    )
    if trial is None:
        return line
    return "\n".join([line, *trial_lines(trial.describe())])


def trial_lines(plan: str) -> list[str]:
    """The lines of a trial's plan (``RunPlan.describe``, as a trial records it in its
    ``plan.json``) that every trial shares, not its name or sampled values: where its
    coordinator and workers run and how its clients train."""
    keep = ("coordinator: ", "workers: ", "clients: ")
    return [
        f"trial {line}".replace("in this process", "in the trial's process")
        for line in plan.splitlines()
        if line.startswith(keep)
    ]


def sweep_counts(
    section: TuneSection, bundles: list[dict[str, float]], total: Mapping
) -> tuple[int, int]:
    """How many trials the sweep has, and how many of them run side by side on ``total``."""
    grid = 1
    for domain in section.space.values():
        grid *= len(domain.args) if domain.kind == "grid" else 1
    trials = grid * section.num_samples
    cpu = sum(b.get("CPU", 0.0) for b in bundles)
    gpu = sum(b.get("GPU", 0.0) for b in bundles)
    fit = int(total.get("CPU", 0.0) // cpu) if cpu else trials
    if gpu:
        fit = min(fit, int(total.get("GPU", 0.0) // gpu))
    if section.max_concurrent_trials:
        fit = min(fit, section.max_concurrent_trials)
    return trials, max(1, min(fit, trials))
