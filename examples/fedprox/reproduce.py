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
import json
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
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


def run_one(overrides: list[str]) -> dict[str, Any]:
    """One run in this process: its per-round metrics and its weights' digest."""
    from raysim.actors.local import local_core
    from raysim.config import load_config

    core = local_core(load_config(CONFIG, overrides), evaluate=True)
    t0 = time.perf_counter()
    while not core.done:
        core.step()
    core.settle()
    rounds = [{k: h[k] for k in KEEP if k in h} for h in core.history]
    return {"rounds": rounds, "digest": core.digest(), "seconds": time.perf_counter() - t0}


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
    path = args.out / "results.json"
    start = path if path.is_file() else args.resume_from
    results: dict[str, Any] = json.loads(start.read_text()) if start else {}
    results.setdefault("runs", {})
    results["rounds"] = args.rounds
    todo = [(d, s, m, seed) for seed in args.seeds for d in args.data
            for s in args.stragglers for m in args.methods]  # fmt: skip
    for i, (d, s, m, seed) in enumerate(todo):
        k = key(d, s, m, seed)
        if k in results["runs"]:
            continue
        twin = key(d, s, SAME[m, s], seed) if (m, s) in SAME else None
        if twin in results["runs"] and seed != args.seeds[0]:
            r = results["runs"][twin] | {"same_as": twin, "seconds": 0.0}
        else:
            over = [*DATA[d], f"devices.stragglers={s}", METHODS[m], f"seed={seed}"]
            over += [f"rounds={args.rounds}"] if args.rounds else []
            r = run_one(over)
        results["runs"][k] = r
        path.write_text(json.dumps(results))
        last = r["rounds"][-1]
        print(f"[{i + 1}/{len(todo)}] {k}: loss {last.get('global_train_loss', float('nan')):.4f}"
              f" acc {last.get('accuracy', float('nan')):.4f} ({r['seconds']:.0f} s)",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
