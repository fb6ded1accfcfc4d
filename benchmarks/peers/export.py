"""Export raysim's quickstart split (examples/quickstart.yaml) to an .npz for the peer twins.

Runs in raysim's own venv, so every framework trains on the very same client data:

    .venv/bin/python benchmarks/peers/export.py [PATH]

PATH defaults to benchmarks/peers/.data/quickstart.npz.

Arrays: ``x`` float32 (all clients' rows, concatenated in client order), ``y`` int64,
``offsets`` int64 (client j's rows are ``offsets[j]:offsets[j + 1]``), ``x_test``, ``y_test``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from raysim.config import load_config
from raysim.data import build_federated_dataset

REPO = Path(__file__).resolve().parents[2]
DEFAULT = Path(__file__).resolve().parent / ".data" / "quickstart.npz"


def export(path: str | Path = DEFAULT) -> Path:
    """Build the quickstart's federated digits split and write it to ``path``."""
    cfg = load_config(REPO / "examples" / "quickstart.yaml", ["tracking.enabled=false"])
    ds = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    parts = [ds.client_data(j) for j in range(cfg.clients.num)]
    sizes = [len(y) for _, y in parts]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        x=np.concatenate([x for x, _ in parts]).astype(np.float32),
        y=np.concatenate([y for _, y in parts]).astype(np.int64),
        offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        x_test=np.asarray(ds.x_test, dtype=np.float32),
        y_test=np.asarray(ds.y_test, dtype=np.int64),
    )
    return path


if __name__ == "__main__":
    out = export(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)
    with np.load(out) as d:
        sizes = np.diff(d["offsets"])
        print(
            f"wrote {out}: {len(sizes)} clients, {len(d['y'])} train rows "
            f"(min {sizes.min()}, max {sizes.max()} per client), {len(d['y_test'])} test rows"
        )
