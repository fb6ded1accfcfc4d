"""``benchmarks/foundation_digest.py``: a short pre-training's digest against those recorded,
each with its CPU; a digest that differs exits 1 and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import foundation_digest  # noqa: E402


def _digest(records, *extra):
    return subprocess.run(
        [sys.executable, "benchmarks/foundation_digest.py", "--steps", "2",
         "--records", str(records), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.matrix  # suite time: three pre-trainings in fresh processes, about 40 s on 2 vCPUs
def test_the_digest_is_recorded_then_compared_and_a_difference_fails(tmp_path):
    records = tmp_path / "digests.json"
    first = _digest(records, "--record")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "nothing recorded for these settings yet" in first.stdout
    [mine] = json.loads(records.read_text())["steps=2 seed=0 kernels=portable"]
    assert mine["capability"] == "DEFAULT" and len(mine["sha256"]) == 64
    # another CPU's record with other bits: this machine's run is the same as its own, and not
    # as that one, which fails the script
    other = {**mine, "cpu": "Another CPU", "sha256": "0" * 64}
    records.write_text(json.dumps({"steps=2 seed=0 kernels=portable": [mine, other]}))
    second = _digest(records)
    assert second.returncode == 1, second.stdout + second.stderr[-2000:]
    assert f"vs {mine['cpu']} (same CPU kind" in second.stdout
    assert ": same" in second.stdout
    assert "vs Another CPU (another CPU kind" in second.stdout and "DIFFERS" in second.stdout
    # posing as an older CPU (glibc told of no AVX or FMA, MKL held to SSE4.2): portable kernels
    # give this CPU's own bits, and the pose is checked to have taken
    records.write_text(json.dumps({"steps=2 seed=0 kernels=portable": [mine]}))
    older = _digest(records, "--as-older-cpu")
    assert older.returncode == 0, older.stdout + older.stderr[-2000:]
    # the loader of glibc before 2.33 (or none) cannot say which features it masked
    said = "unknown" if foundation_digest.glibc_features(dict(os.environ)) is None else "yes"
    assert f"foundation_digest.glibc_masked={said}" in older.stdout
    assert f"vs {mine['cpu']} (same CPU kind" in older.stdout and ": same" in older.stdout


def test_a_digest_made_posing_as_an_older_cpu_is_never_recorded(tmp_path):
    records = tmp_path / "digests.json"
    refused = _digest(records, "--as-older-cpu", "--record")
    assert refused.returncode == 2 and "never recorded" in refused.stderr
    assert not records.exists()
