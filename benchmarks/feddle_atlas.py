"""``feddle_atlas``: Feddle's per-round server preparation at a large model's size.

Each round, Feddle builds the normalised anchor matrix Ā (|A| × d, float32) from its atlas and
hands it, with the base model, to the coefficient search on the server's device (Feddle spec §3.3,
§3.7). This times that preparation, the atlas's ``normalized`` and the tensors the search gets,
against the form it replaced (``np.stack``, then scaling in place, then ``torch.tensor`` copies),
in the same script. Both must give the same matrix bit for bit. Last line: ``prep_vs_before``.

    python benchmarks/feddle_atlas.py --dim 11000000 --anchors 10
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from common import machine, report

from raysim.algorithms.feddle.atlas import Atlas


def before(atlas: Atlas, base: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    raw = np.stack([s.delta for s in atlas.slots])
    norms = atlas.norms()
    raw *= (float(np.median(norms)) / norms).astype(np.float32)[:, None]
    return torch.tensor(raw), torch.tensor(base)


def now(atlas: Atlas, base: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    anchors, _ = atlas.normalized("median")
    return torch.from_numpy(anchors), torch.from_numpy(base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=11_000_000, help="d: ResNet18 has ~11 M")
    parser.add_argument("--anchors", type=int, default=10, help="|A| = M = 2·S")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    atlas = Atlas(args.anchors)
    for i in range(args.anchors):
        atlas.insert(rng.standard_normal(args.dim, dtype=np.float32) * (i + 1), 0, i, 0)
    weights = rng.standard_normal(args.dim, dtype=np.float32)
    walls: dict[str, list[float]] = {"before": [], "now": []}
    last: dict[str, torch.Tensor] = {}
    for _ in range(args.repeats):
        for name, prep in (("before", before), ("now", now)):
            last.pop(name, None)  # free the previous matrix first, as a round's is freed
            base = weights.copy()  # in Feddle, a fresh fancy-indexed copy
            t0 = time.perf_counter()
            last[name], _ = prep(atlas, base)
            walls[name].append(time.perf_counter() - t0)
    same = torch.equal(last["before"], last["now"])
    for name, values in walls.items():
        report(name, prep_s_each=" ".join(f"{v:.3f}" for v in values))
        report(name, prep_s=statistics.median(values))
    report(dim=args.dim, anchors=args.anchors, same_matrix=same)
    report(prep_vs_before=statistics.median(walls["now"]) / statistics.median(walls["before"]))


if __name__ == "__main__":
    main()
