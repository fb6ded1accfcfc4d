"""FedProx's systems-heterogeneity experiment (Li et al., MLSys 2020, §5.2, Figures 1, 5 and 7)
on raysim's devices: FedAvg dropping stragglers against FedProx with μ = 0 and μ = 1 keeping
their partial work, at 0 %, 50 % and 90 % stragglers, on Synthetic(1,1) and Synthetic-IID (the
paper's) and on Synthetic(0,0) and (0.5,0.5) (beyond it), five seeds each.

Each run is ``systems.yaml`` with its cell's overrides, in this process. Every round's
``global_train_loss`` (the loss over all 30 devices' training rows, the paper's f(w)) and
``accuracy`` (the pooled test rows of all devices) go to ``OUT/results.json`` after each run; a run
already there is not run again, so an interrupted reproduction continues where it stopped.
``report.py`` turns the file into ``RESULTS.md``, its verdicts and plots.

    python examples/fedprox/reproduce.py --out runs/fedprox                 # the whole grid
    python examples/fedprox/reproduce.py --out runs/fedprox --data 1_1 iid  # the paper's cells
    python examples/fedprox/reproduce.py --out /tmp/q --rounds 5 --seeds 0  # a look, minutes
    python examples/fedprox/reproduce.py --out runs/fedprox \
        --resume-from examples/fedprox/results.json          # continue the committed runs

A run of 200 rounds takes 4-8 minutes on 2 CPUs (FedProx's heavy-tailed device sizes: 7,000 local
steps a round on average), so the grid is hours; it is meant to run in pieces.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from grid import run_grid, run_one  # noqa: E402

CONFIG = HERE / "systems.yaml"
SEEDS = [0, 1, 2, 3, 4]
#: name -> data.synthetic overrides (the paper's Synthetic(α, β) and Synthetic-IID)
DATA = {
    "1_1": ["data.synthetic.alpha=1", "data.synthetic.beta=1"],
    "iid": ["data.synthetic.iid=true", "data.synthetic.alpha=0", "data.synthetic.beta=0"],
    "0_0": ["data.synthetic.alpha=0", "data.synthetic.beta=0"],
    "0.5_0.5": ["data.synthetic.alpha=0.5", "data.synthetic.beta=0.5"],
}
STRAGGLERS = [0.0, 0.5, 0.9]
#: name -> algorithm section; partial work follows each method's default (devices.partial_work
#: auto): FedAvg drops its stragglers, FedProx keeps what they did
METHODS = {
    "fedavg": "algorithm={name: fedavg}",
    "fedprox_mu0": "algorithm={name: fedprox, mu: 0.0}",
    "fedprox_mu1": "algorithm={name: fedprox, mu: 1.0}",
}
#: cells that are another cell by construction: FedProx with μ = 0 and no stragglers is FedAvg
#: (no proximal term, no partial work, the same aggregation). The first seed runs both (the
#: report's C4 checks they end bit for bit alike); later seeds reuse FedAvg's run, marked
#: ``same_as``
SAME = {("fedprox_mu0", 0.0): "fedavg"}
#: what each round keeps
KEEP = ("global_train_loss", "global_train_accuracy", "accuracy", "loss", "devices_partial",
        "devices_stragglers", "clients_arrived")  # fmt: skip


def key(data: str, stragglers: float, method: str, seed: int) -> str:
    return f"{data}/s{stragglers:g}/{method}/seed{seed}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", nargs="+", default=list(DATA), choices=list(DATA))
    ap.add_argument("--stragglers", nargs="+", type=float, default=STRAGGLERS)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    ap.add_argument("--rounds", type=int, default=None, help="default: the config's 200")
    ap.add_argument("--resume-from", type=Path, default=None, help="start from this results.json")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    def cell(d: str, s: float, m: str, seed: int):
        twin = key(d, s, SAME[m, s], seed) if (m, s) in SAME else None

        def run(runs: dict[str, Any]) -> dict[str, Any]:
            if twin in runs and seed != args.seeds[0]:
                return runs[twin] | {"same_as": twin, "seconds": 0.0}
            over = [*DATA[d], f"devices.stragglers={s}", METHODS[m], f"seed={seed}"]
            return run_one(CONFIG, over + ([f"rounds={args.rounds}"] if args.rounds else []), KEEP)

        return key(d, s, m, seed), run

    cells = [cell(d, s, m, seed) for seed in args.seeds for d in args.data
             for s in args.stragglers for m in args.methods]  # fmt: skip

    def line(r: dict[str, Any]) -> str:
        last = r["rounds"][-1]
        return (f"loss {last.get('global_train_loss', float('nan')):.4f} "
                f"acc {last.get('accuracy', float('nan')):.4f}")  # fmt: skip

    run_grid(args.out / "results.json", cells, line, start=args.resume_from)


if __name__ == "__main__":
    main()
