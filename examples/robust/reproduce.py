"""Accuracy and backdoor success against the fraction of adversaries, for FedAvg and each robust
rule (``backdoor.yaml``): ζ in {0, 0.1, 0.2, 0.3}, five seeds each, under two attacks: the
backdoor by model replacement, and ALIE ("a little is enough", forged on the server from the
round's benign updates, z = Baruch et al.'s z_max), which aims at accuracy.

Each run is ``backdoor.yaml`` with its cell's overrides, in this process; its per-round
``accuracy`` and ``backdoor_accuracy`` (the attack's success rate) and robust metrics go to
``OUT/results.json`` after each run, and a run already there is not run again. ``report.py``
turns the file into ``RESULTS.md`` and ``robust.png``.

f, what a rule is set to tolerate, is the same for every ζ (the server does not know ζ): 6 of the
round's 20 updates (30 %), or the largest its paper covers for n = 20 (Bulyan: 4). The attackers
boost by 1/ζ (model replacement by the round's expected share of attackers).

    python examples/robust/reproduce.py --out runs/robust             # the grid: minutes
    python examples/robust/reproduce.py --out /tmp/q --seeds 0 --rounds 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from grid import run_grid, run_one  # noqa: E402

CONFIG = HERE / "backdoor.yaml"
SEEDS = [0, 1, 2, 3, 4]
FRACTIONS = [0.0, 0.1, 0.2, 0.3]
RULES = ["none", "krum", "multi_krum", "median", "trimmed_mean", "bulyan", "geometric_median",
         "centered_clipping", "norm_bound"]  # fmt: skip
#: what each round keeps
KEEP = ("accuracy", "backdoor_accuracy", "robust_attackers", "robust_attackers_chosen",
        "robust_forged", "robust_skipped")  # fmt: skip
PER_ROUND = 20


def tolerated(rule: str, n: int = PER_ROUND, most: int = 6) -> int:
    """The f a rule is set to: ``most``, or the largest its paper covers for n."""
    from raysim.robust.rules import RULES as PAPERS

    return max(f for f in range(most + 1) if PAPERS[rule].valid(n, f)) if rule != "none" else 0


ATTACKS = ["backdoor", "alie"]


def key(attack: str, fraction: float, rule: str, seed: int) -> str:
    return f"{attack}/z{fraction:g}/{rule}/seed{seed}"


def overrides(attack: str, fraction: float, rule: str, seed: int) -> list[str]:
    """The cell's overrides; at ζ = 0 the attack applies to no client (the backdoor's
    evaluation set, the clean model's rate of reading a trigger as 0, stays)."""
    who = f"fraction: {fraction}" if fraction else "clients: []"
    if attack == "backdoor":
        boost = f", boost: {1 / fraction:g}" if fraction else ""
        behaviour = f"{{name: backdoor, target: 0, size: 2, poison_fraction: 0.5, {who}{boost}}}"
    else:
        behaviour = f"{{name: alie, {who}}}"
    return [f"robust.rule={rule}", f"robust.f={tolerated(rule)}", f"seed={seed}",
            f"hooks.clients=[{behaviour}]"]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--attacks", nargs="+", default=ATTACKS, choices=ATTACKS)
    ap.add_argument("--fractions", nargs="+", type=float, default=FRACTIONS)
    ap.add_argument("--rules", nargs="+", default=RULES, choices=RULES)
    ap.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    ap.add_argument("--rounds", type=int, default=None, help="default: the config's 30")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rounds = [f"rounds={args.rounds}"] if args.rounds else []

    def cell(a: str, z: float, r: str, s: int):
        over = overrides(a, z, r, s) + rounds
        return key(a, z, r, s), lambda _: run_one(CONFIG, over, KEEP)

    cells = [cell(a, z, r, s) for s in args.seeds for a in args.attacks for z in args.fractions
             for r in args.rules]  # fmt: skip

    def line(r: dict[str, Any]) -> str:
        last = r["rounds"][-1]
        return (f"accuracy {last['accuracy']:.3f} backdoor "
                f"{last.get('backdoor_accuracy', float('nan')):.3f}")  # fmt: skip

    run_grid(args.out / "results.json", cells, line)


if __name__ == "__main__":
    main()
