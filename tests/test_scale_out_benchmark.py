"""``benchmarks/scale_out.py --quick``: a loopback cluster of 1 then 2 nodes, every update whole
and then one partial sum per node, with the checks its output states."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.matrix  # suite time: a multi-process cluster of its own, about 1.5 min on 2 vCPUs
def test_scale_out_quick_sums_per_node_with_the_same_bits():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "benchmarks/scale_out.py", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    checks = [
        dict(field.split("=", 1) for field in line.split()[1:])
        for line in out.stdout.splitlines()
        if line.startswith("check ")
    ]
    assert [c["nodes"] for c in checks] == ["1", "2"], out.stdout[-3000:]
    for c in checks:
        assert c["same_bits"] == "True", c
        assert c["worker_nodes"] == c["nodes"], c  # one worker on each node
        # one int64 partial a node reaches the coordinator, not each client's float32 update
        assert 0 < int(c["partial_bytes_in"]) <= int(c["nodes_x_2_x_model"]), c
        assert int(c["whole_bytes_in"]) == int(c["clients_x_model"]), c
    assert "PROJECTION, not a measurement" in out.stdout
