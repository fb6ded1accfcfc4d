"""Regression goldens: final metrics and per-tensor weight summaries of a few reference runs.

``tests/goldens/regression.json`` was written *before* the method-interface change of issue 8,
and ``tests/test_regression.py`` compares every later version of raysim against it at a tolerance
that catches a changed algorithm but forgives last-bit differences between CPU models (a stored
digest would only hold on one kind of CPU, see docs/execution.md).

Regenerate (only when a change of results is intended, and say so in the commit)::

    python -m tests.regression --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).with_name("goldens") / "regression.json"

#: name → (config file, overrides). Shortened where the full example would slow the suite down.
CASES: dict[str, tuple[str, list[str]]] = {
    "quickstart": ("examples/quickstart.yaml", ["rounds=12"]),
    "async_fedavg": ("examples/async-mini.yaml", ["rounds=20", "algorithm={name: fedavg}"]),
    "async_fedbuff": ("examples/async-mini.yaml", ["rounds=20"]),
    "async_fedasync": ("examples/async-mini.yaml", ["rounds=20", "algorithm={name: fedasync}"]),
    "fedoa_smoke": ("examples/fedoa/smoke.yaml", []),
}
#: Metrics that measure time or bytes of the host, not the algorithm.
NOT_COMPARED = ("wall", "_s", "time_s")


def case_config(name: str):
    import raysim

    path, overrides = CASES[name]
    return raysim.load_config(ROOT / path, [*overrides, "tracking.enabled=false"])


def tensor_names(cfg) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of each tensor of the global vector, in vector order."""
    from raysim.data import build_federated_dataset
    from raysim.sim.build import data_spec, method_resident

    ds = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    return method_resident(cfg, data_spec(ds)).global_shapes()


def summarise(cfg, weights: np.ndarray) -> dict[str, list[float]]:
    """name → [float64 sum, float64 L2 norm] of each tensor of the final global vector."""
    out, offset = {}, 0
    w = np.asarray(weights, dtype=np.float64)
    for name, shape in tensor_names(cfg):
        n = int(np.prod(shape))
        t = w[offset : offset + n]
        out[name] = [float(t.sum()), float(np.linalg.norm(t))]
        offset += n
    assert offset == len(w), (offset, len(w))
    return out


def comparable(metrics: dict[str, float]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if not any(tag in k for tag in NOT_COMPARED) and not k.startswith("total_bytes")
    }


def run_case(name: str) -> dict:
    import raysim

    cfg = case_config(name)
    res = raysim.run(cfg)
    return {
        "metrics": comparable(res.metrics),
        "tensors": summarise(cfg, res.weights),
        "digest": res.weights_digest,
    }


def main(argv: list[str]) -> None:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = {name: run_case(name) for name in CASES}
    for name, rec in out.items():
        print(f"{name}: digest {rec['digest']}")
    if "--write" in argv:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main(sys.argv[1:])
