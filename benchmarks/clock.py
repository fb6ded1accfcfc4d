"""Coordinator throughput with zero-compute clients: virtual-clock events/s and memory at scale.

``CoordinatorCore`` (FedAvg, half-normal delays) runs in-process on a null executor whose results
are a shared zero delta with ``num_samples=1``: no training, no evaluation, no tracking. An event is
one dispatch or one delivery (delivered = arrived + rejected). A second run with 100,000 clients
reports the process's peak RSS (``ru_maxrss``, torch and numpy imports included).
Last two lines: ``events_per_s`` and ``rss_mb_100k_clients``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from typing import Any

import numpy as np
from common import machine, peak_rss_mb, report

from raysim.actors.coordinator_core import CoordinatorCore
from raysim.actors.jobs import ClientJob, ClientResult
from raysim.config import RunConfig, load_config


class NullExecutor:
    """Implements the ``Executor`` protocol without computing anything."""

    def __init__(self, size: int) -> None:
        self.zero = np.zeros(size, dtype=np.float32)
        self.zero.flags.writeable = False
        self._pending: dict[int, int] = {}
        self.submitted = 0

    def put(self, weights: np.ndarray) -> np.ndarray:
        return weights

    def get(self, handle: Any) -> Any:
        return handle

    def events(self) -> list[str]:
        return []

    def sum_counts(self) -> tuple[int, dict[str, float]]:
        return 0, {}

    def submit(self, handle: Any, jobs: list[ClientJob]) -> None:
        for job in jobs:
            self._pending[job.job_id] = job.client
        self.submitted += len(jobs)

    def result(self, job_id: int) -> ClientResult:
        return ClientResult(job_id, self._pending.pop(job_id), self.zero, 1)

    def kill_worker(self, index: int) -> None:
        pass

    def describe(self) -> list[dict[str, Any]]:
        return [{"worker": 0, "mode": "null"}]

    def close(self) -> None:
        self._pending.clear()


def make_config(clients: int, per_round: int, rounds: int, sigma: float) -> RunConfig:
    return load_config(
        {
            "name": "clock-bench",
            "rounds": rounds,
            "clients": {"num": clients, "per_round": per_round},
            "algorithm": {"name": "fedavg"},
            "delays": {"kind": "half_normal", "sigma": sigma},
            "tracking": {"enabled": False},
        }
    )


def run_clock(cfg: RunConfig, size: int) -> dict[str, float]:
    """Step a null-executor coordinator to the end; events, wall and events/s."""
    executor = NullExecutor(size)
    core = CoordinatorCore(
        cfg,
        np.zeros(size, dtype=np.float32),
        np.ones(cfg.clients.num, dtype=np.int64),
        executor,
        evaluator=None,
        tracker=None,
    )
    t0 = time.perf_counter()
    while not core.done:
        core.step()
    wall = time.perf_counter() - t0
    dispatched = sum(s.dispatched for s in core.stats.values())
    delivered = int(
        sum(m["clients_arrived"] for m in core.history) + core.history[-1]["rejected_updates"]
    )
    return {
        "clients": cfg.clients.num,
        "per_round": cfg.clients.per_round,
        "rounds": cfg.rounds,
        "sigma": cfg.delays.sigma,
        "dispatched": dispatched,
        "computed": executor.submitted,
        "delivered": delivered,
        "wall_s": wall,
        "events_per_s": (dispatched + delivered) / wall,
    }


def sampling(populations: list[int], per_round: int, rounds: int, sigma: float) -> None:
    """``Schedule.dispatch`` alone at each population (ms a round, median; traced allocation
    peak), against the smallest population, in this one process."""
    import tracemalloc

    from raysim.sim.clock import Schedule
    from raysim.sim.delays import build_delay_model, parse_delay_params

    params = parse_delay_params({"kind": "half_normal", "sigma": sigma})
    base = None
    for j in populations:
        schedule = Schedule(j, per_round, build_delay_model(params, j, 0), 0)
        tracemalloc.start()
        times = []
        for k in range(rounds):
            t0 = time.perf_counter()
            schedule.dispatch(k)
            times.append(time.perf_counter() - t0)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        ms = float(np.median(times[3:])) * 1e3
        base = base or ms
        report(f"sampling.{j}", round_ms=ms, vs_smallest=ms / base, peak_kb=peak / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--per-round", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--sigma", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=10, help="model size (float32 elements)")
    parser.add_argument("--big-clients", type=int, default=100_000)
    parser.add_argument("--big-per-round", type=int, default=5_000)
    parser.add_argument("--big-rounds", type=int, default=50)
    parser.add_argument("--profile", action="store_true", help="cProfile the first run")
    parser.add_argument(
        "--sampling",
        action="store_true",
        help="only the schedule's sampling, 100 clients a round from 10^3 to 10^8 clients",
    )
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    if args.sampling:
        sampling([10**3, 10**4, 10**6, 10**8], 100, 200, args.sigma)
        return

    cfg = make_config(args.clients, args.per_round, args.rounds, args.sigma)
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    small = run_clock(cfg, args.size)
    if profiler is not None:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
        print(out.getvalue())
    report("clock", **small)

    rss_before = peak_rss_mb()
    big_cfg = make_config(args.big_clients, args.big_per_round, args.big_rounds, args.sigma)
    big = run_clock(big_cfg, args.size)
    report("big", **big, rss_mb_before=rss_before)
    report(events_per_s=small["events_per_s"])
    report(rss_mb_100k_clients=peak_rss_mb())


if __name__ == "__main__":
    main()
