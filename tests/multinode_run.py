"""Run by tests/test_multinode.py in a fresh process: a 2-node in-process Ray cluster
(``ray.cluster_utils.Cluster``), one CPU per node. A run, then a two-trial Tune sweep (one trial
is that run again), both with a node-local sqlite store: the coordinators must sit on the
driver's node (the head)."""

from __future__ import annotations

import json
import os
import sys

from raysim.launch.private_ray import private_ray_auth

private_ray_auth()  # token auth, as a private run's Ray has

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import raysim  # noqa: E402
from tests.conftest import tiny  # noqa: E402


def main(store: str) -> None:
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        ray.init(address=cluster.address, logging_level="ERROR")
        head = ray.get_runtime_context().get_node_id()
        cfg = raysim.load_config(tiny(rounds=3, tracking={"uri": store, "experiment": "mn"}))
        session = raysim.RunSession(cfg, address=cluster.address)
        try:
            nodes = sorted({w["node_id"] for w in session.workers()})
            for _ in session.rounds():
                pass
            result = session.finish()
        finally:
            session.close()
        sweep = raysim.tune(
            tiny(
                rounds=3,
                workers={"count": 1, "num_cpus": 0.5},  # two trials side by side
                tracking={"uri": store, "experiment": "mn-sweep"},
                tune={"space": {"local.lr": {"grid": [0.05, 0.1]}}, "metric": "accuracy"},
            ),
            storage=os.path.join(os.path.dirname(store.removeprefix("sqlite:///")), "tune"),
        )
        print(
            json.dumps(
                {
                    "head": head,
                    "nodes": nodes,
                    "digest": result.weights_digest,
                    "run_id": result.run_id,
                    "parent": sweep.parent_run_id,
                    "trials": {str(r["local.lr"]): r["weights_digest"] for r in sweep.table},
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
