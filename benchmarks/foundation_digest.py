"""``foundation_digest``: does a foundation pre-trained here have the same bits as one made on
another CPU kind (issue 62)?

``raysim pretrain tiny-llama`` runs portable kernels by default (``raysim/util/kernels.py``) so
that the same seeds make the same weights on any x86 CPU. This script pre-trains a short one
(``--steps``, default 300: a difference in rounding shows within a few steps and only grows) in
a fresh process, and compares its weights' sha256 with every digest recorded in
``foundation_digests.json`` for the same settings, each kept with the CPU it was made on. It
prints what it measured and where; ``--record`` adds this machine's digest to the file.

    python benchmarks/foundation_digest.py            # compare with the recorded digests
    python benchmarks/foundation_digest.py --record   # and keep this CPU's

The exit status is 1 when a digest recorded for the same settings differs (on another CPU kind:
the kernels are not portable there; on the same kind: not even deterministic).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, report

from raysim.models.foundation import foundation_metadata

RECORDS = Path(__file__).with_name("foundation_digests.json")


def pretrain(steps: int, seed: int, kernels: str) -> tuple[dict, float]:
    """Pre-train in a fresh process (portable kernels are set before torch loads): the
    foundation's metadata and the seconds it took."""
    with tempfile.TemporaryDirectory(prefix="digest-") as tmp:
        out = Path(tmp) / "f"
        cmd = [sys.executable, "-m", "raysim.cli", "pretrain", "tiny-llama", "--out", str(out),
               "--steps", str(steps), "--seed", str(seed), "--kernels", kernels]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - t0
        return foundation_metadata(out), seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", choices=["portable", "native"], default="portable")
    ap.add_argument("--record", action="store_true", help="keep this machine's digest")
    ap.add_argument("--records", type=Path, default=RECORDS, help="the recorded digests (JSON)")
    args = ap.parse_args()
    key = f"steps={args.steps} seed={args.seed} kernels={args.kernels}"
    meta, seconds = pretrain(args.steps, args.seed, args.kernels)
    here = {"cpu": meta["machine"]["cpu"], "capability": meta["machine"]["cpu_capability"],
            "torch": meta["machine"]["torch"], "sha256": meta["weights_sha256"]}  # fmt: skip
    records = json.loads(args.records.read_text()) if args.records.is_file() else {}
    before = records.get(key, [])
    report("foundation_digest", machine=machine(), settings=key, seconds=round(seconds, 1))
    report("foundation_digest", sha256=here["sha256"], cpu=here["cpu"])
    differs = 0
    for r in before:
        same = r["sha256"] == here["sha256"]
        differs += not same
        kind = "same CPU kind" if r["cpu"] == here["cpu"] else "another CPU kind"
        print(f"  vs {r['cpu']} ({kind}, torch {r['torch']}): {'same' if same else 'DIFFERS'}")
    if not before:
        print("  nothing recorded for these settings yet (--record keeps this one)")
    if args.record and here not in before:
        records[key] = [*before, here]
        args.records.write_text(json.dumps(records, indent=1) + "\n")
        print(f"  recorded in {args.records}")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
