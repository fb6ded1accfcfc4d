"""Where a run's coordinator goes on a multi-node cluster, so that the MLflow store it writes is
the one the user browses.

The coordinator is the run's only MLflow writer. A store that only one node reaches (a sqlite or
file path, or a tracking server on a loopback address; ``raysim.tracking.store.node_local``) is
the right store only on the node of the process that named it: the driver. So, with
``coordinator.node: store`` (the default), such a run's coordinator is pinned to the driver's
node; a store every node reaches (``http://HEAD_IP:5000``) lets it go anywhere. A Tune sweep pins
its trials' first two bundles (the trial's process, the coordinator) the same way. Whatever
slips through (the coordinator would not be where the store is) fails before the coordinator
starts, with ``StoreUnreachable`` naming what to set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from raysim.config import ConfigError, RunConfig
from raysim.tracking.store import node_local, store_path

#: Ray's resource that only the head node has
HEAD_RESOURCE = "node:__internal_head__"

FIX = (
    "run an MLflow server every node reaches and name it (tracking.uri=http://HEAD_IP:5000, "
    "cluster/README.md), or set coordinator.node=any if this path is on a filesystem every node "
    "mounts"
)


class StoreUnreachable(ConfigError):
    """The coordinator runs on a node that does not hold the run's node-local store."""


def store_node(cfg: RunConfig, tracking_uri: str | None) -> str | None:
    """The node the coordinator must run on: this process's node when the store is node-local
    (and ``coordinator.node`` is ``store``), else None. Needs Ray to be up."""
    import ray

    if not tracking_uri or cfg.coordinator.node == "any" or not node_local(tracking_uri):
        return None
    return ray.get_runtime_context().get_node_id()


def coordinator_options(cfg: RunConfig, tracking_uri: str | None) -> dict[str, Any]:
    """``.options()`` for the coordinator actor: its resources, and where it goes. Inside a
    placement group (a Tune trial) it takes the group's second bundle, the one planned for it,
    and its workers join the group; otherwise, with a node-local store, it is pinned to this
    node. With ``workers.transport: in_process`` it also holds the worker's share, which trains
    in its process. Raises ``StoreUnreachable`` for a placement that would write to another
    store."""
    import ray
    from ray.util import get_current_placement_group, placement_group_table
    from ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )

    in_process = cfg.workers.transport == "in_process"
    options: dict[str, Any] = {
        "num_cpus": cfg.coordinator.num_cpus + (cfg.workers.num_cpus if in_process else 0.0),
        "num_gpus": cfg.coordinator.num_gpus,
    }
    at = store_node(cfg, tracking_uri)
    pg = get_current_placement_group()
    if pg is not None and len(pg.bundle_specs) > 1:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=1, placement_group_capture_child_tasks=True
        )
        if at is not None:
            ray.get(pg.ready())
            there = placement_group_table(pg)["bundles_to_node_id"][1]
            check_store_node(tracking_uri, at, there)
    elif at is not None:
        node = next((n for n in ray.nodes() if n["NodeID"] == at), {})
        have = node.get("Resources", {})
        for key, need in (("CPU", options["num_cpus"]), ("GPU", options["num_gpus"])):
            if need > have.get(key, 0.0):  # a pin the node cannot host would wait for ever
                raise StoreUnreachable(
                    f"the tracking store {tracking_uri} is local to this node, so the "
                    f"coordinator runs here, but coordinator.num_{key.lower()}s={need:g} and "
                    f"this node has {have.get(key, 0.0):g}; lower it, or {FIX}"
                )
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(at, soft=False)
    return options


def check_store_node(tracking_uri: str | None, store_at: str | None, there: str) -> None:
    """``store_at``: the node whose disk or loopback holds the store (None: every node reaches
    it); ``there``: the coordinator's node."""
    if tracking_uri and store_at and store_at != there:
        raise StoreUnreachable(
            f"the tracking store {tracking_uri} is local to node {store_at[:12]}, but this run's "
            f"coordinator (its only MLflow writer) would run on node {there[:12]}, where that "
            f"URI names another store; {FIX}"
        )


def trial_pin(cfg: RunConfig, tracking_uri: str | None) -> dict[str, float]:
    """What a Tune trial's first two bundles (its process, the coordinator) add so that they
    land on the sweep driver's node when the store is node-local: the head's own resource (a
    sweep is driven from the head: ``ray job submit`` runs it there). Nothing on a one-node
    cluster or for a store every node reaches; refused for a node-local store driven from
    another node."""
    import ray

    here = store_node(cfg, tracking_uri)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if here is None or len(nodes) < 2:
        return {}
    node = next((n for n in nodes if n["NodeID"] == here), {})
    if HEAD_RESOURCE in node.get("Resources", {}):
        return {HEAD_RESOURCE: 0.001}
    raise StoreUnreachable(
        f"this sweep is driven from a worker node and its tracking store {tracking_uri} is "
        f"local to it; drive it from the head (ray job submit), or {FIX}"
    )


def job_working_dir() -> Path | None:
    """The temporary copy of ``--working-dir`` this process runs in, when it is the entrypoint
    of a submitted Ray job (Ray deletes the copy with the job's session); else None."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except ValueError:
        return None
    return Path.cwd().resolve() if runtime_env.get("working_dir") else None


def check_outlives_job(path: str | Path | None, what: str, fix: str) -> None:
    """Refuse ``path`` inside a Ray job's temporary working directory: ``what`` would land there
    and vanish with the job."""
    work = job_working_dir()
    if work is not None and path is not None and Path(path).resolve().is_relative_to(work):
        raise ConfigError(
            f"this Ray job runs in a temporary copy of its working_dir ({work}), so {what} "
            f"would vanish with the job: {fix}"
        )


def check_store_outlives_job(tracking_uri: str | None) -> None:
    """Refuse a tracking store inside a Ray job's temporary working directory."""
    check_outlives_job(
        store_path(tracking_uri) if tracking_uri else None,
        f"the tracking store {tracking_uri}",
        "name one that outlives it, e.g. MLFLOW_TRACKING_URI=http://127.0.0.1:5000 in the "
        "runtime env (the MLflow server on the head, cluster/README.md) or "
        "tracking.uri=sqlite:////ABSOLUTE/PATH/mlflow.db",
    )


def check_state_outlives_job(cfg: RunConfig) -> None:
    """Refuse a personal-state store (``clients.state.store: disk``) inside a Ray job's
    temporary working directory: a resume needs it after the job."""
    if cfg.clients.state.store == "disk":
        check_outlives_job(
            cfg.clients.state.dir,
            f"the personal-state store (clients.state.dir={cfg.clients.state.dir})",
            "set clients.state.dir to an absolute path outside it that every node mounts, e.g. "
            "clients.state.dir=/mnt/shared/raysim-states",
        )
