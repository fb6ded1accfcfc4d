"""Every FedBaF example, whole, with the leak auditor on: no false positive, and its cost.

``examples/fedbaf/mini.yaml`` and ``mini-lm.yaml`` over FedAvg, FedProx and FedAdam
(``algorithm.base``), each run to its last round on a local Ray with ``audit.leaks: true`` (the
examples' own setting). A false positive would stop a run with a ``LeakError``; none may. Per run:
the final accuracy, the auditor's seconds per round (``audit_wall_s``) against the round's wall
(``round_wall_s``), means over the rounds, and the weights digest. The foundations are pretrained
first where missing (``raysim pretrain digits|markov``, seconds).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from common import ROOT, machine, report

from raysim.launch.session import run

EXAMPLES = {"mini": "digits", "mini-lm": "markov"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=list(EXAMPLES))
    ap.add_argument("--bases", nargs="+", default=["fedavg", "fedprox", "fedadam"])
    args = ap.parse_args()
    print(f"machine={machine()}", flush=True)
    for name in args.examples:
        found = Path("foundations") / EXAMPLES[name]
        if not found.exists():
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "raysim.cli",
                    "pretrain",
                    EXAMPLES[name],
                    "--out",
                    str(found),
                ],
                check=True,
            )
        for base in args.bases:
            config = ROOT / "examples" / "fedbaf" / f"{name}.yaml"
            result = run(config, [f"algorithm.base={base}", "tracking.enabled=false"])
            rounds = [h for h in result.history if "audit_wall_s" in h]
            audit = statistics.mean(h["audit_wall_s"] for h in rounds)
            wall = statistics.mean(h["round_wall_s"] for h in rounds)
            report(
                f"{name}.{base}",
                rounds=len(rounds),
                accuracy=result.metrics.get("accuracy", float("nan")),
                audit_ms=1e3 * audit,
                round_ms=1e3 * wall,
                audit_fraction=audit / wall,
                digest=result.weights_digest[:8],
            )


if __name__ == "__main__":
    main()
