"""A run on a two-node Ray cluster (ray.cluster_utils.Cluster) spreads workers over both nodes and
gives the same weights as the single-node run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import raysim
from tests.conftest import ROOT, tiny

pytestmark = pytest.mark.slow


def test_two_node_cluster_matches_single_node(ray_cluster):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.multinode_run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(out["nodes"]) == 2  # one worker (1 CPU) per node
    local = raysim.run(tiny(rounds=3, tracking={"enabled": False}))
    assert out["digest"] == local.weights_digest
