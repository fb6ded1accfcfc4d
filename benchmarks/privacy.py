"""What differential privacy costs a run (``privacy:``), as ratios measured in this one script.

1. A DP-FedAvg round against the same round without privacy: the quickstart workload (FedAvg,
   digits, 10 clients a round, 5 local epochs), batched clients, in this process. Privacy adds a
   clip per client on the worker (inside the batched groups) and one Gaussian draw per sum at the
   server. Rounds alternate between the two runs, so that this machine's drift hits both alike;
   the figure is the ratio of their median round walls (issue 59 asks for ≤ 1.15).
2. The accountant: the mean wall of one ``Accountant.step()`` over 1,000 aggregations, for fixed
   size sampling (RDP) and Poisson sampling (RDP, PLD), against the same run's median round wall
   (issue 59 asks for ≤ 5 ms a round).

    python benchmarks/privacy.py [--rounds 12] [--repeats 3]

Prints ``key=value`` lines; the machine first.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import QUICKSTART, machine, report


def round_walls(overrides: list[str], rounds: int, repeats: int) -> dict[str, list[float]]:
    """Per-round walls of each named run, its rounds interleaved with the others'."""
    from raysim.actors.local import local_core
    from raysim.config import load_config

    base = [f"rounds={rounds}", "eval.every=1000", "tracking.enabled=false",
            "workers.execution=batched"]  # fmt: skip
    runs = {"plain": [], "dp": overrides}
    walls: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        cores = {k: local_core(load_config(QUICKSTART, [*base, *o])) for k, o in runs.items()}
        for core in cores.values():  # a first round each: imports and warm-up, not timed
            core.step()
        while not all(c.done for c in cores.values()):
            for k, core in cores.items():
                if not core.done:
                    t0 = time.perf_counter()
                    core.step()
                    walls[k].append(time.perf_counter() - t0)
    return walls


def accountant_ms(sampling: str, method: str, steps: int) -> float:
    """Mean milliseconds of one ``Accountant.step()`` (ε after each) over ``steps``."""
    from raysim.privacy.accounting import Accountant, Schedule

    acc = Accountant(Schedule(10_000, 100, sampling), 1.0, 1e-6, method)
    t0 = time.perf_counter()
    for _ in range(steps):
        acc.step()
    return (time.perf_counter() - t0) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1000, help="aggregations the accountant counts")
    args = ap.parse_args()
    report(machine=machine())
    dp = ["privacy.mode=central", "privacy.clip=0.5", "privacy.noise_multiplier=1.0"]
    walls = round_walls(dp, args.rounds, args.repeats)
    plain, private = statistics.median(walls["plain"]), statistics.median(walls["dp"])
    report("round", plain_median_s=plain, dp_median_s=private, rounds_each=len(walls["dp"]),
           dp_over_plain=private / plain)  # fmt: skip
    for sampling, method in (("without_replacement", "rdp"), ("poisson", "rdp"),
                             ("poisson", "pld")):  # fmt: skip
        ms = accountant_ms(sampling, method, args.steps)
        report(f"accountant.{sampling}.{method}", ms_per_round=ms,
               share_of_plain_round=ms / 1e3 / plain)  # fmt: skip


if __name__ == "__main__":
    main()
