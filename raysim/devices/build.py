"""A run's device clock from its config: the traces it names and the work its clients do."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from raysim.training.settings import optimizer_steps

from .clock import DeviceSchedule, Work
from .traces import DeviceTraces

if TYPE_CHECKING:
    from raysim.config import RunConfig

#: the synthetic generator's default size: one entry per client, at most this many
MAX_SYNTHETIC_DEVICES = 1_000_000


def load_traces(cfg: RunConfig) -> DeviceTraces:
    """The traces ``devices`` names: the seeded generator, FedScale's pickles or a folder."""
    d = cfg.devices
    if d.traces == "fedscale":
        from .fedscale import read_fedscale

        return read_fedscale(d.path, d.availability_path)
    if d.traces == "files":
        from .traces import read_traces

        return read_traces(d.path)
    from .synthetic import synthetic_traces

    s = d.synthetic
    n = s.devices or min(cfg.clients.num, MAX_SYNTHETIC_DEVICES)
    return synthetic_traces(n, cfg.seed, **s.model_dump(exclude={"devices"}))


def policies(cfg: RunConfig) -> tuple[bool, str]:
    """(accept partial work, late: drop or deliver), ``auto`` resolved by the method's spec."""
    from raysim.algorithms.registry import method_spec

    d = cfg.devices
    spec = method_spec(cfg.algorithm.name)
    late = d.late if d.late != "auto" else ("deliver" if spec.asynchronous else "drop")
    if late == "deliver":
        return False, late
    partial = spec.partial_work if d.partial_work == "auto" else d.partial_work == "accept"
    return partial, late


def device_schedule(
    cfg: RunConfig, client_sizes: np.ndarray, model_bytes: int, traces: DeviceTraces | None = None
) -> DeviceSchedule:
    """The run's ``DeviceSchedule``: ``client_sizes`` give each client's local steps,
    ``model_bytes`` what a job downloads and uploads."""
    d = cfg.devices
    partial, late = policies(cfg)
    close = d.close_after
    if close is None and d.overcommit > 1:
        close = cfg.clients.per_round  # FedScale: sample 1.3·K, keep the first K
    work = Work(
        optimizer_steps(client_sizes, cfg.local),
        cfg.local.batch_size,
        int(model_bytes),
        d.backward_factor,
        cfg.local.epochs,
    )
    return DeviceSchedule(
        traces if traces is not None else load_traces(cfg),
        work,
        cfg.clients.per_round,
        cfg.seed,
        deadline_s=d.deadline_s,
        start_s=d.start_s,
        overcommit=d.overcommit,
        close_after=close,
        partial=partial,
        min_steps=d.min_steps,
        late=late,
        availability=d.availability,
        stragglers=d.stragglers,
    )


def plan_line(cfg: RunConfig) -> str:
    """What a run's plan says of its devices (``raysim run --dry-run``)."""
    d = cfg.devices
    partial, late = policies(cfg)
    source = {
        "synthetic": "synthetic traces (seeded)",
        "fedscale": f"FedScale's traces at {d.path}",
        "files": f"traces in {d.path}",
    }[d.traces]
    parts = [source, f"rounds of at most {d.deadline_s:g} s from {d.start_s:g} s"]
    parts.append("availability respected" if d.availability else "availability ignored")
    if d.overcommit > 1 or d.close_after:
        k = d.close_after or cfg.clients.per_round
        parts.append(f"sample {d.overcommit:g}×, close at {k} reports")
    if d.stragglers:
        parts.append(f"{d.stragglers:.0%} stragglers a round (FedProx §5.2)")
    if late == "deliver":
        parts.append("late updates delivered in later rounds")
    else:
        parts.append("partial work " + ("accepted" if partial else "dropped"))
    return ", ".join(parts)
