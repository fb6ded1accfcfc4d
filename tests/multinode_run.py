"""Run by tests/test_multinode.py in a fresh process: a 2-node in-process Ray cluster."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import raysim  # noqa: E402
from tests.conftest import tiny  # noqa: E402


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        ray.init(address=cluster.address, logging_level="ERROR")
        cfg = raysim.load_config(tiny(rounds=3, tracking={"enabled": False}))
        session = raysim.RunSession(cfg, address=cluster.address)
        try:
            nodes = sorted({w["node_id"] for w in session.workers()})
            for _ in session.rounds():
                pass
            result = session.finish()
        finally:
            session.close()
        print(json.dumps({"nodes": nodes, "digest": result.weights_digest}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
