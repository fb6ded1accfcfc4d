"""Async vs sync cost per client job: quickstart on local Ray (2 CPU workers, no tracking).

``--runtime local``: both without Ray, in this process (``runtime=local``, one worker), as
``raysim run`` runs a config that trains one group at a time (``raysim.launch.without_ray``).

Sync runs ``--rounds`` rounds with no delays. Async uses half-normal delays (σ=20 by default). With
delays, jobs whose arrival round is past the last round are dispatched but never computed
(``CoordinatorCore._dispatch``), so both runs are compared on *computed* jobs, counted from the
history as Σ ``clients_arrived`` + the final ``rejected_updates`` (= delivered = computed). The
async run's length is chosen by replaying its schedule offline: the fewest rounds whose computed
jobs reach the sync run's count (the counts then match to within a few jobs). The comparison is
wall time of the stepping loop per computed job; the gap left in the counts is thus normalised too.

Both runs evaluate the global model once, at the end (``eval.every`` larger than the run): the
async run needs about twice the rounds for the same jobs, and per-round evaluation is real work per
round, not a cost of the virtual clock (pass ``--set eval.every=1`` to include it). The async run
goes twice: with late jobs waiting to train together (``workers.late_jobs: together``, the
default) and each round's jobs at once (``at_dispatch``). Last line: ``async_sync_ratio`` = async
/ sync wall per computed job.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import QUICKSTART, machine, report

from raysim.config import RunConfig, load_config
from raysim.launch.private_ray import ensure_ray
from raysim.sim.clock import Schedule
from raysim.sim.delays import build_delay_model


def computed_jobs(cfg: RunConfig, rounds: int) -> int:
    """Jobs of ``cfg``'s schedule that arrive within ``rounds`` rounds (= jobs computed)."""
    delay = build_delay_model(cfg.delays, cfg.clients.num, cfg.seed)
    schedule = Schedule(cfg.clients.num, cfg.clients.per_round, delay, cfg.seed)
    return sum(int((schedule.dispatch(k).arrival_rounds < rounds).sum()) for k in range(rounds))


def matching_rounds(cfg: RunConfig, target: int, limit: int = 10_000) -> int:
    """The fewest rounds for which ``cfg`` computes at least ``target`` jobs."""
    lo, hi = 1, 1
    while computed_jobs(cfg, hi) < target:
        lo, hi = hi + 1, hi * 2
        if hi > limit:
            raise ValueError(f"{target} jobs are not reached within {limit} rounds")
    while lo < hi:
        mid = (lo + hi) // 2
        if computed_jobs(cfg, mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def timed_run(cfg: RunConfig) -> dict[str, float]:
    """Run one ``RunSession``'s rounds as ``raysim run`` does (``RunSession.rounds``: the
    coordinator runs rounds in batches per driver call); their wall and the jobs computed."""
    from raysim.launch.session import RunSession

    session = RunSession(cfg)
    try:
        session.workers()  # every worker actor constructed before the clock starts
        t0 = time.perf_counter()
        history = list(session.rounds())  # `raysim run`'s path: rounds in batches per call
        wall = time.perf_counter() - t0
    finally:
        session.close()
    jobs = int(sum(m["clients_arrived"] for m in history) + history[-1]["rejected_updates"])
    return {"rounds": cfg.rounds, "jobs": jobs, "wall_s": wall, "ms_per_job": wall / jobs * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(QUICKSTART))
    parser.add_argument("--rounds", type=int, default=60, help="sync rounds")
    parser.add_argument("--sigma", type=float, default=20.0, help="half-normal delay σ (rounds)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="sync/async pairs (median)")
    parser.add_argument("--set", nargs="*", default=[], help="extra key=value overrides (both)")
    parser.add_argument("--runtime", choices=("ray", "local"), default="ray")
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    import ray

    local = args.runtime == "local"
    base = [
        f"runtime={args.runtime}",
        f"workers.count={'auto' if local else args.workers}",
        "workers.num_cpus=1",
        "tracking.enabled=false",
        "eval.every=1000000",
        *args.set,
    ]
    sync = load_config(args.config, [*base, f"rounds={args.rounds}", "delays.kind=none"])
    target = computed_jobs(sync, sync.rounds)
    delays = ["delays.kind=half_normal", f"delays.sigma={args.sigma}"]
    probe = load_config(args.config, [*base, *delays])
    rounds = matching_rounds(probe, target)
    asyn = load_config(args.config, [*base, *delays, f"rounds={rounds}"])
    # the reference for late jobs: each round's jobs trained at once, in groups of that round
    at_dispatch = load_config(
        args.config, [*base, *delays, f"rounds={rounds}", "workers.late_jobs=at_dispatch"]
    )
    report(
        "config",
        file=args.config,
        runtime=args.runtime,
        workers=1 if local else args.workers,
        sigma=args.sigma,
        sync_rounds=sync.rounds,
        async_rounds=rounds,
        eval_every=sync.eval.every,
        repeats=args.repeats,
    )

    if not local:
        ensure_ray(num_cpus=args.workers)
    try:
        pairs, pairs_at_dispatch = [], []
        for _ in range(args.repeats):
            s, a, d = timed_run(sync), timed_run(asyn), timed_run(at_dispatch)
            report("sync", **s)
            report("async", **a)
            report("async_at_dispatch", **d)
            pairs.append(a["ms_per_job"] / s["ms_per_job"])
            pairs_at_dispatch.append(d["ms_per_job"] / s["ms_per_job"])
    finally:
        if not local:
            ray.shutdown()
    report(async_at_dispatch_sync_ratio=statistics.median(pairs_at_dispatch))
    report(async_sync_ratio=statistics.median(pairs))


if __name__ == "__main__":
    main()
