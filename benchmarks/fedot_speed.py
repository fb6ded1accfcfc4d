"""FedOT's workload: raysim against a plain single-process loop doing the same training.

The workload is ``examples/fedot/mini.yaml`` (FedOT spec §9: 50 clients, m = 30, τ = 1, k_max = 10,
affine maps and quadratic potentials, every client in every round). Three ways, same data, same
initial model, same batches (``client_seed`` + ``step_batches``):

- ``plain``: ``raysim.algorithms.fedot.lockstep.Lockstep`` with sync centring, one process, one
  torch thread: a list of 50 client models advanced in a Python loop, averaged every round (what
  the spec's pilot did, without its vectorisation);
- ``inprocess``: raysim's coordinator and one worker in this process (``local_core``): the same
  jobs, states and strategy as a real run, no Ray;
- ``raysim``: a ``RunSession`` on local Ray with ``--workers`` CPU workers.

Steady-state per-round wall = median over rounds after the first 3 (no evaluation). The last lines
are the ratios against ``plain``; ``where`` splits the in-process round into the clients' own
compute and the rest (job set-up, state load and store, aggregation).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from common import ROOT, machine, report, steady
from overhead import run_raysim

from raysim.actors.jobs import client_seed
from raysim.actors.local import local_core
from raysim.algorithms.fedot.lockstep import Lockstep
from raysim.config import RunConfig, load_config
from raysim.sim.build import data_spec, method_resident, run_dataset
from raysim.training.loop import step_batches
from raysim.training.tasks import ClassificationTask

MINI = ROOT / "examples" / "fedot" / "mini.yaml"


def run_plain(cfg: RunConfig) -> list[float]:
    torch.set_num_threads(1)
    ds = run_dataset(cfg)
    model = method_resident(cfg, data_spec(ds)).module
    n = cfg.clients.num
    ls = Lockstep(model, n, cfg.algorithm.params, ClassificationTask(), cfg.local.lr, "sync")
    data = [tuple(torch.from_numpy(a) for a in ds.client_data(i)) for i in range(n)]
    sizes = ds.client_sizes()
    walls = []
    for r in range(cfg.rounds):
        t0 = time.perf_counter()
        batches = [
            list(
                step_batches(
                    int(sizes[i]),
                    cfg.local,
                    torch.Generator().manual_seed(client_seed(cfg.seed, i, r)),
                )
            )
            for i in range(n)
        ]
        ls.round(data, batches)
        walls.append(time.perf_counter() - t0)
    return walls


def run_inprocess(cfg: RunConfig) -> tuple[list[float], float]:
    """Per-round walls and the share of them the runner spent inside ``train``."""
    torch.set_num_threads(1)
    core = local_core(cfg)
    runner = core.executor.runner
    algo = runner.client_algorithm
    inside = [0.0]
    train = algo.train

    def timed(ctx):
        t0 = time.perf_counter()
        try:
            return train(ctx)
        finally:
            inside[0] += time.perf_counter() - t0

    algo.train = timed
    walls, shares = [], []
    while not core.done:
        inside[0] = 0.0
        t0 = time.perf_counter()
        core.step()
        wall = time.perf_counter() - t0
        walls.append(wall)
        shares.append(inside[0] / wall)
    return walls, float(np.median(shares[3:] or shares))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    overrides = [
        f"rounds={args.rounds}",
        f"workers.count={args.workers}",
        "workers.num_cpus=1",
        "tracking.enabled=false",
        f"eval.every={args.rounds + 1}",
        "workers.execution=sequential",  # one client at a time, as the plain loop
    ]
    cfg = load_config(MINI, overrides)
    report("config", file=str(MINI.relative_to(ROOT)), rounds=cfg.rounds, workers=args.workers)
    plain = steady(run_plain(cfg))
    walls, share = run_inprocess(cfg)
    inprocess = steady(walls)
    from raysim.launch.session import ensure_ray

    ensure_ray(num_cpus=args.workers)
    ray_round = steady(run_raysim(cfg)[0])
    report("round_s", plain=plain, inprocess=inprocess, raysim=ray_round)
    report("where", train_share_inprocess=share)
    report("ratio", inprocess_vs_plain=inprocess / plain, raysim_vs_plain=ray_round / plain)


if __name__ == "__main__":
    main()
