"""Population size: FedAvg on ``synthetic`` through ``raysim run``, 100 clients per round, J in
{10^3, 10^4, 10^5, 10^6} (issue 43).

Per J: the median round's wall time (rounds 3 to the last, MLflow's ``round_wall_s``; the first
rounds warm the workers up), its ratio to the smallest J's round, and the peak resident memory
of the driver, the coordinator and the largest worker, polled every 50 ms from the process tree
(Ray's processes included). Goals (issue 43): a round at 10^6 within 1.2x of a round at 10^3;
the coordinator at 10^6 within 2 GB.

    python benchmarks/population.py                       # J = 1e3 1e4 1e5 1e6, 20 rounds
    python benchmarks/population.py --clients 1000 1000000 --rounds 10
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import ROOT, machine, raysim_run

EXAMPLE = ROOT / "examples" / "synthetic.yaml"


def one_run(clients: int, rounds: int, store: Path) -> dict[str, float]:
    done = raysim_run([str(EXAMPLE), f"clients.num={clients}", f"rounds={rounds}"], store)
    peak = done.memory.peak
    return {
        "round_s": statistics.median(done.metric("round_wall_s")[2:]),
        "command_s": done.seconds,
        **{f"{k}_gb": peak[k] / 2**30 for k in ("driver", "coordinator", "worker")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    rows = []
    for j in args.clients:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append((j, one_run(j, args.rounds, Path(tmp))))
        r = rows[-1][1]
        print(
            f"J={j}: round {r['round_s'] * 1e3:.0f} ms, command {r['command_s']:.1f} s", flush=True
        )
    base = rows[0][1]["round_s"]
    print(
        f"\nFedAvg on synthetic(1,1), {args.rounds} rounds, 100 clients a round\n\n"
        "| J | round (median, ms) | vs smallest J | command (s) | driver peak (GB) | "
        "coordinator peak (GB) | largest worker peak (GB) |\n|---|---|---|---|---|---|---|"
    )
    for j, r in rows:
        print(
            f"| {j:,} | {r['round_s'] * 1e3:.0f} | {r['round_s'] / base:.2f}x | "
            f"{r['command_s']:.1f} | {r['driver_gb']:.2f} | {r['coordinator_gb']:.2f} | "
            f"{r['worker_gb']:.2f} |"
        )


if __name__ == "__main__":
    main()
