"""Run by tests/test_partial_sums.py in a fresh process: the quickstart with partial sums on a
3-node in-process Ray cluster (``ray.cluster_utils.Cluster``), one CPU and one worker per node;
prints the run's digest, its workers' nodes and its per-round byte counts as one JSON line."""

from __future__ import annotations

import json
import sys

from raysim.launch.private_ray import private_ray_auth

private_ray_auth()  # token auth, as a private run's Ray has

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import raysim  # noqa: E402
from tests.conftest import EXAMPLES  # noqa: E402

OVERRIDES = [
    "rounds=3",
    "eval.every=3",
    "tracking.enabled=false",
    "workers.group_size=3",
    "runtime=ray",
    "workers.count=3",
    "workers.transport=calls",
    "workers.partial_sums=true",
]


def main() -> None:
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        ray.init(address=cluster.address, logging_level="ERROR")
        cfg = raysim.load_config(EXAMPLES / "quickstart.yaml", OVERRIDES)
        session = raysim.RunSession(cfg, address=cluster.address)
        try:
            nodes = [w["node_id"] for w in session.workers()]
            for _ in session.rounds():
                pass
            result = session.finish()
        finally:
            session.close()
        print(
            json.dumps(
                {
                    "digest": result.weights_digest,
                    "worker_nodes": nodes,
                    "bytes_in": [h["coordinator_bytes_in"] for h in result.history],
                    "bytes_up": [h["bytes_up"] for h in result.history],
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
