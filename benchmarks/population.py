"""Population size: FedAvg on ``synthetic`` through ``raysim run``, 100 clients per round, J in
{10^3, 10^4, 10^5, 10^6} (issue 43).

Per J: the median round's wall time (rounds 3 to the last, MLflow's ``round_wall_s``; the first
rounds warm the workers up), its ratio to the smallest J's round, and the peak resident memory
of the driver, the coordinator and the largest worker, polled every 50 ms from the process tree
(Ray's processes included). Goals (issue 43): a round at 10^6 within 1.2x of a round at 10^3;
the coordinator at 10^6 within 2 GB.

``--devices``: each J runs again with ``devices.enabled`` (synthetic traces, one entry a client:
availability, speeds, the clock in seconds), and the table gives that round's ratio to the round
without devices at the same J (issue 60: within 1.2x at 10^6). It also times the device clock
alone (``DeviceSchedule.dispatch`` at 10^6 clients, 100 a round, 48 rounds) against a quickstart
round in this process (issue 60: below 5 % of it).

    python benchmarks/population.py                       # J = 1e3 1e4 1e5 1e6, 20 rounds
    python benchmarks/population.py --clients 1000 1000000 --rounds 10
    python benchmarks/population.py --clients 1000000 --devices
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import ROOT, machine, raysim_run

EXAMPLE = ROOT / "examples" / "synthetic.yaml"


def one_run(clients: int, rounds: int, store: Path, extra: tuple[str, ...] = ()) -> dict:
    done = raysim_run([str(EXAMPLE), f"clients.num={clients}", f"rounds={rounds}", *extra], store)
    peak = done.memory.peak
    return {
        "round_s": statistics.median(done.metric("round_wall_s")[2:]),
        "command_s": done.seconds,
        **{f"{k}_gb": peak[k] / 2**30 for k in ("driver", "coordinator", "worker")},
    }


def device_clock_share() -> tuple[float, float]:
    """(median ms of ``DeviceSchedule.dispatch`` at 10^6 clients with synthetic traces, 100 a
    round, half-hour rounds over a day; median ms of a quickstart round, in this process)."""
    import time

    import numpy as np

    from raysim.actors.local import local_core
    from raysim.config import load_config
    from raysim.devices.clock import DeviceSchedule, Work
    from raysim.devices.synthetic import synthetic_traces

    n = 10**6
    work = Work(np.full(n, 30, np.int64), 10, 40_000)
    clock = DeviceSchedule(synthetic_traces(n, 0), work, 100, 0, deadline_s=1800.0, partial=True)
    walls = []
    for k in range(48):
        t0 = time.perf_counter()
        clock.dispatch(k)
        walls.append(time.perf_counter() - t0)
    cfg = load_config(ROOT / "examples" / "quickstart.yaml",
                      ["rounds=12", "eval.every=100", "tracking.enabled=false"])  # fmt: skip
    core = local_core(cfg)
    rounds = []
    while not core.done:
        t0 = time.perf_counter()
        core.step()
        rounds.append(time.perf_counter() - t0)
    return statistics.median(walls) * 1e3, statistics.median(rounds[2:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--devices", action="store_true", help="also with devices (issue 60)")
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
        if args.devices:
            with tempfile.TemporaryDirectory() as tmp:
                d = one_run(j, args.rounds, Path(tmp), ("devices.enabled=true",))
            r["devices_over_plain"] = d["round_s"] / r["round_s"]
            print(f"J={j} with devices: round {d['round_s'] * 1e3:.0f} ms, "
                  f"devices/plain {r['devices_over_plain']:.3f}", flush=True)  # fmt: skip
    if args.devices:
        clock_ms, round_ms = device_clock_share()
        print(f"device clock at 10^6 clients: {clock_ms:.2f} ms a round (median of 48); "
              f"quickstart round {round_ms:.1f} ms; share {clock_ms / round_ms:.3f}")  # fmt: skip
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
