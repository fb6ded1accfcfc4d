"""Robust aggregation's cost per round at the coordinator (issue 61).

A round of n updates of a d-parameter model (seeded Gaussian updates, 10 % of them shifted far
away) goes through the server as raysim runs it: each update arrives at the method's strategy
(FedAvg), and the round ends. The reference is FedAvg's own round in the same process (the
weighted mean of the n deltas); each rule's round is timed as a ratio to it, and the table says
how each grows from the smaller n to the larger (×10 clients: Krum, Multi-Krum and Bulyan build
the n × n distance matrix, O(n²·d); the coordinate-wise rules sort each coordinate's n values,
O(n log n·d); the geometric median and centred clipping make O(n·d) passes).

norm_bound is not timed here: it clips each update on its worker (O(d) there) and leaves the
server's mean as FedAvg's.

    python benchmarks/robust.py                          # n = 100 and 1000, d = 10^6
    python benchmarks/robust.py --clients 100 --dim 100000 --rules krum median
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
from common import machine

from raysim.algorithms.base import Update
from raysim.algorithms.registry import get_method
from raysim.robust.server import RobustStrategy
from raysim.robust.settings import RobustConfig

RULES = ["krum", "multi_krum", "median", "trimmed_mean", "bulyan", "geometric_median",
         "centered_clipping"]  # fmt: skip


def round_updates(n: int, d: int, seed: int = 0) -> list[Update]:
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n):
        delta = rng.standard_normal(d, dtype=np.float32)
        if c >= n - n // 10:
            delta += np.float32(5.0)
        out.append(
            Update(
                client_id=c,
                delta=delta,
                num_samples=10 + c % 7,
                dispatch_round=0,
                dispatch_version=0,
                arrival_time=0.0,
                arrival_round=0,
                tau_versions=0,
                base=None,
            )  # fmt: skip
        )
    return out


def one_round(rule: str, updates: list[Update], f: int) -> float:
    """Seconds for the round's arrivals and its end, through FedAvg (wrapped by the rule)."""
    method = get_method("fedavg")
    d = updates[0].delta.size
    strategy = method.strategy(method.spec.params(), np.zeros(d, dtype=np.float32), len(updates))
    if rule != "none":
        strategy = RobustStrategy(strategy, RobustConfig(rule=rule, f=f), [])
    gc.collect()
    t0 = time.perf_counter()
    for u in updates:
        strategy.on_arrival(u)
    strategy.on_round_end(0)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--dim", type=int, default=1_000_000)
    ap.add_argument("--rules", nargs="+", default=RULES, choices=RULES)
    ap.add_argument("--repeats", type=int, default=3, help="rounds timed per cell (median)")
    args = ap.parse_args()
    print(f"machine: {machine()}")
    print(f"d = {args.dim:,} parameters (float32); f = n // 10 adversaries tolerated (Bulyan: "
          "the largest f with n >= 4f + 3 if smaller)")  # fmt: skip
    table: dict[str, dict[int, float]] = {}
    for n in args.clients:
        updates = round_updates(n, args.dim)
        reps = args.repeats if n * args.dim <= 2e8 else 1
        for rule in ["none", *args.rules]:
            f = n // 10 if rule != "bulyan" else min(n // 10, (n - 3) // 4)
            table.setdefault(rule, {})[n] = float(
                np.median([one_round(rule, updates, f) for _ in range(reps)])
            )
            print(f"  n = {n}: {rule} {table[rule][n]:.3f} s", flush=True)
        del updates
    ns = args.clients
    head = " | ".join(f"n = {n}: s, × FedAvg" for n in ns)
    growth = f" growth, n ×{ns[-1] / ns[0]:g} |" if len(ns) > 1 else ""
    print(f"\n| rule | {head} |{growth}")
    print("|---" * (1 + len(ns) + (len(ns) > 1)) + "|")
    for rule, times in table.items():
        cells = " | ".join(f"{times[n]:.3f} s, {times[n] / table['none'][n]:.1f}×" for n in ns)
        grow = f" {times[ns[-1]] / times[ns[0]]:.1f}× |" if len(ns) > 1 else ""
        print(f"| {'fedavg (mean)' if rule == 'none' else rule} | {cells} |{grow}")


if __name__ == "__main__":
    main()
