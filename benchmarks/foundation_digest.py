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
    python benchmarks/foundation_digest.py --as-older-cpu   # as if this CPU lacked AVX and FMA

``--as-older-cpu`` is the check one machine can make alone: glibc is told the CPU has no AVX,
AVX2, AVX-512 or FMA (``GLIBC_TUNABLES``, so libm's functions take their other code paths) and
MKL is held to SSE4.2; portable kernels should give the same bits as this CPU's own record. It
says nothing of what only another CPU runs (MKL's code for an Intel CPU, say), so its digest is
never recorded.

The exit status is 1 when a digest recorded for the same settings differs (on another CPU kind:
the kernels are not portable there; on the same kind: not even deterministic).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, report

from raysim.models.foundation import foundation_metadata

RECORDS = Path(__file__).with_name("foundation_digests.json")

#: an older x86 CPU as glibc's function dispatch and MKL see it (``--as-older-cpu``)
OLDER_CPU_ENV = {
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX2,-FMA,-AVX",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
}
LOADER = Path("/lib64/ld-linux-x86-64.so.2")


def glibc_features(env: dict[str, str]) -> str | None:
    """The CPU features glibc finds usable under ``env`` (its loader's diagnostics, glibc
    2.33 and later); None where the loader cannot say."""
    try:
        out = subprocess.run([str(LOADER), "--list-diagnostics"], env=env, capture_output=True,
                             text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    active = [line for line in out.splitlines() if ".active[" in line]
    return "\n".join(active) or None


def pretrain(steps: int, seed: int, kernels: str, env: dict[str, str]) -> tuple[dict, float]:
    """Pre-train in a fresh process under ``env`` (portable kernels are set before torch
    loads): the foundation's metadata and the seconds it took."""
    with tempfile.TemporaryDirectory(prefix="digest-") as tmp:
        out = Path(tmp) / "f"
        cmd = [sys.executable, "-m", "raysim.cli", "pretrain", "tiny-llama", "--out", str(out),
               "--steps", str(steps), "--seed", str(seed), "--kernels", kernels]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=env)
        seconds = time.perf_counter() - t0
        return foundation_metadata(out), seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", choices=["portable", "native"], default="portable")
    ap.add_argument("--record", action="store_true", help="keep this machine's digest")
    ap.add_argument(
        "--as-older-cpu",
        action="store_true",
        help="run as if this CPU lacked AVX, AVX2, AVX-512 and FMA (never recorded)",
    )
    ap.add_argument("--records", type=Path, default=RECORDS, help="the recorded digests (JSON)")
    args = ap.parse_args()
    if args.record and args.as_older_cpu:
        ap.error("--as-older-cpu is not this CPU's digest: it is never recorded")
    key = f"steps={args.steps} seed={args.seed} kernels={args.kernels}"
    env = dict(os.environ)
    if args.as_older_cpu:
        env.update(OLDER_CPU_ENV)
        masked = glibc_features(env)
        if masked is not None and masked == glibc_features(dict(os.environ)):
            print("glibc ignored GLIBC_TUNABLES here (the same features usable): no older CPU "
                  "to pose as", file=sys.stderr)  # fmt: skip
            return 2
        posed = " ".join(f"{k}={v}" for k, v in OLDER_CPU_ENV.items())
        glibc = "unknown" if masked is None else "yes"
        report("foundation_digest", as_older_cpu=posed, glibc_masked=glibc)
    meta, seconds = pretrain(args.steps, args.seed, args.kernels, env)
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
