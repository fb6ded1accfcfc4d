"""Simulator overhead: raysim on local Ray (2 CPU workers) vs a plain PyTorch loop, same work.

Both sides run the quickstart workload (FedAvg, digits, 100 clients Dir(0.3), 10 per round, MLP,
evaluation of the global model every ``eval.every`` rounds) from the same dataset, initial weights,
schedule (``raysim.sim.clock.Schedule``), client seeds (``client_seed``) and aggregation order
(arrivals by arrival time then client id; ``WeightedMean.combine`` with n_j/Σn), so the final
weights should match bit for bit. The plain loop keeps one resident model and loads each client's
starting weights into it (what a raysim worker does), with the client tensors built once up front.

Steady-state per-round wall = median over rounds after the first 3. ``ray.init`` and session
construction (coordinator + workers ready) are timed and reported separately, not per round.
Repeats interleave plain and raysim runs (Ray stays up throughout; idle, it costs the plain loop
nothing measurable), since this VM's speed drifts by 10-20% from minute to minute.
Last line: ``overhead_ratio`` = raysim steady round / plain loop (1 torch thread) steady round.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import torch
from common import QUICKSTART, machine, report, steady

from raysim.actors.jobs import client_seed
from raysim.algorithms.base import WeightedMean
from raysim.config import RunConfig, load_config
from raysim.data import build_federated_dataset
from raysim.models import build_model
from raysim.models.params import get_flat, set_flat, trainable
from raysim.sim.build import data_spec, initial_weights, weights_digest
from raysim.sim.clock import ArrivalQueue, PendingJob, Schedule
from raysim.sim.delays import build_delay_model
from raysim.training.loop import evaluate, train_local
from raysim.training.tasks import ClassificationTask


def run_raysim(cfg: RunConfig, advance: bool | None = None) -> tuple[list[float], str, float]:
    """One ``RunSession`` (on the running Ray instance, or without Ray where ``cfg.runtime`` is
    ``local``): per-round walls, digest, start-up time.

    ``advance`` None: one driver call per round (``session.step``), each round's wall timed by
    the driver. True or False: the rounds as ``raysim run`` runs them (``session.rounds``, in
    batches), with (True) or without each round's evaluation overlapping the next round's
    dispatch; a round's wall is then the coordinator's ``wall_time`` from the last round's."""
    from raysim.launch.session import RunSession

    t0 = time.perf_counter()
    session = RunSession(cfg)
    try:
        session.workers()  # blocks until every worker actor is constructed
        start = time.perf_counter() - t0
        walls = []
        if advance is None:
            while not session.done:
                t0 = time.perf_counter()
                session.step()
                walls.append(time.perf_counter() - t0)
        else:
            stamps = [m["wall_time"] for m in session.rounds(overlap=advance)]
            walls = list(np.diff(stamps))
        return walls, session.finish().weights_digest, start
    finally:
        session.close()


def run_plain(
    cfg: RunConfig, threads: int, scores: dict[str, float] | None = None
) -> tuple[list[float], str]:
    """The same FedAvg run as a plain single-process PyTorch loop with ``threads`` threads;
    ``scores`` gets the last evaluation's (accuracy, loss)."""
    torch.set_num_threads(threads)
    dataset = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    weights = initial_weights(cfg, dataset)
    model = build_model(cfg.model, data_spec(dataset))
    x_test = torch.tensor(np.asarray(dataset.x_test))
    y_test = torch.tensor(np.asarray(dataset.y_test), dtype=torch.long)
    tensors = []
    for j in range(cfg.clients.num):
        x, y = dataset.client_data(j)
        tensors.append((torch.tensor(x), torch.tensor(y, dtype=torch.long)))
    delay = build_delay_model(cfg.delays, cfg.clients.num, cfg.seed)
    schedule = Schedule(cfg.clients.num, cfg.clients.per_round, delay, cfg.seed)
    queue = ArrivalQueue()  # for the ordering only: with no delays every job lands in round k
    task = ClassificationTask()
    walls = []
    for k in range(cfg.rounds):
        t0 = time.perf_counter()
        d = schedule.dispatch(k)
        for client, t_arr, r_arr in zip(
            d.clients.tolist(), d.arrival_times.tolist(), d.arrival_rounds.tolist(), strict=True
        ):
            queue.push(PendingJob(client, k, k, t_arr, r_arr, client))
        deltas, sizes = [], []
        for job in queue.pop_round(k):
            x, y = tensors[job.client]
            set_flat(model, weights)
            seed = client_seed(cfg.seed, job.client, k)
            torch.manual_seed(seed)
            gen = torch.Generator().manual_seed(seed)
            train_local(model, trainable(model), task, (x, y), cfg.local, gen)
            deltas.append(get_flat(model) - weights)
            sizes.append(len(y))
        if deltas:
            total = sum(sizes)
            weights = weights + WeightedMean.combine(deltas, [n / total for n in sizes])
        if (k + 1) % cfg.eval.every == 0 or k + 1 == cfg.rounds:
            set_flat(model, weights)
            scored = evaluate(model, x_test, y_test)
            if scores is not None:
                scores.update(scored)
        walls.append(time.perf_counter() - t0)
    if len(queue):
        raise RuntimeError("the plain loop only reproduces runs without delays")
    return walls, weights_digest(np.asarray(weights, dtype=np.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(QUICKSTART))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="raysim sessions / plain runs")
    parser.add_argument("--workers", type=int, default=2, help="Ray CPU workers (= ray CPUs)")
    parser.add_argument(
        "--execution",
        default="sequential",
        help="workers.execution of the raysim side (sequential: the plain loop's weights, bit "
        "for bit; batched: benchmarks/batched.py)",
    )
    parser.add_argument(
        "--batches",
        action="store_true",
        help="also run raysim's rounds as `raysim run` does (in batches per driver call), with "
        "and without each round's evaluation overlapping the next round's dispatch, and the "
        "overlapped way again with plain actor calls instead of compiled graphs "
        "(workers.transport=calls)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="with --batches and --workers 1: the overlapped way again with the worker trained "
        "in the coordinator's process (workers.transport=in_process)",
    )
    parser.add_argument(
        "--tracking",
        action="store_true",
        help="raysim logs to a fresh MLflow store (a user's default) instead of not at all",
    )
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    overrides = [
        f"rounds={args.rounds}",
        f"workers.count={args.workers}",
        "workers.num_cpus=1",
        "delays.kind=none",
        f"workers.execution={args.execution}",
    ]
    store = tempfile.mkdtemp()
    if args.tracking:
        overrides.append(f"tracking.uri=sqlite:///{store}/mlflow.db")
    else:
        overrides.append("tracking.enabled=false")
    cfg = load_config(args.config, overrides)
    report(
        "config",
        file=args.config,
        rounds=cfg.rounds,
        clients=cfg.clients.num,
        per_round=cfg.clients.per_round,
        workers=args.workers,
        execution=args.execution,
        tracking=args.tracking,
        eval_every=cfg.eval.every,
        repeats=args.repeats,
    )

    import ray

    from raysim.launch.session import ensure_ray

    t0 = time.perf_counter()
    ensure_ray(num_cpus=args.workers)
    ray_init = time.perf_counter() - t0
    # Repeats interleave plain and raysim runs so that drift in this VM's speed hits both alike.
    walls: dict[str, list[list[float]]] = {"plain_1thread": [], "plain_2thread": [], "raysim": []}
    if args.batches:
        walls.update(
            {"raysim_batches": [], "raysim_batches_overlap": [], "raysim_batches_overlap_calls": []}
        )
        calls = load_config(args.config, [*overrides, "workers.transport=calls"])
    batched_sides = ["raysim_batches", "raysim_batches_overlap", "raysim_batches_overlap_calls"]
    if args.batches and args.in_process:
        here = load_config(args.config, [*overrides, "workers.transport=in_process"])
        walls["raysim_batches_overlap_in_process"] = []
        batched_sides.append("raysim_batches_overlap_in_process")
    digests: dict[str, set[str]] = {name: set() for name in walls}
    starts = []
    try:
        for _ in range(args.repeats):
            for threads in (1, 2):
                w, digest = run_plain(cfg, threads)
                walls[f"plain_{threads}thread"].append(w)
                digests[f"plain_{threads}thread"].add(digest)
            w, digest, start = run_raysim(cfg)
            walls["raysim"].append(w)
            digests["raysim"].add(digest)
            starts.append(start)
            if args.batches:
                sides = (
                    ("raysim_batches", cfg, False),
                    ("raysim_batches_overlap", cfg, True),
                    ("raysim_batches_overlap_calls", calls, True),
                ) + (
                    (("raysim_batches_overlap_in_process", here, True),) if args.in_process else ()
                )
                for name, side_cfg, overlap in sides:
                    w, digest, _ = run_raysim(side_cfg, advance=overlap)
                    walls[name].append(w)
                    digests[name].add(digest)
    finally:
        ray.shutdown()

    report("raysim", ray_init_s=ray_init, session_start_s=statistics.median(starts))
    med: dict[str, float] = {}
    for name, runs in walls.items():
        med[name] = statistics.median(steady(w) for w in runs)
        report(name, round_ms=" ".join(f"{x * 1e3:.1f}" for x in runs[0]))
        report(name, steady_round_ms_each=" ".join(f"{steady(w) * 1e3:.1f}" for w in runs))
        digest = ",".join(d[:16] for d in sorted(digests[name]))
        report(name, steady_round_ms=med[name] * 1e3, digest=digest)
    same = {name: d == digests["raysim"] for name, d in digests.items() if name != "raysim"}
    for name, ok in same.items():
        report(name, same_weights=ok)
    report(same_weights=same["plain_1thread"] and len(digests["raysim"]) == 1)
    report(overhead_ratio_vs_2threads=med["raysim"] / med["plain_2thread"])
    if args.batches:
        for name in batched_sides:
            report(**{f"{name}_ratio": med[name] / med["plain_1thread"]})
    report(overhead_ratio=med["raysim"] / med["plain_1thread"])


if __name__ == "__main__":
    main()
