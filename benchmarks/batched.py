"""``batched_vs_plain``: the quickstart's steady-state round, batched raysim against the plain
sequential loop of ``overhead.py`` (one process, one client after another: the physical limit of
sequential training).

Four ways, interleaved per repeat so that this VM's drift hits them alike:

- ``plain``: ``overhead.run_plain`` with one torch thread;
- ``sequential`` / ``batched``: raysim's coordinator and one worker in this process
  (``local_core``, no Ray), ``workers.execution`` sequential or batched (groups of
  ``--group-size``);
- ``ray_batched``: a ``RunSession`` on local Ray (``runtime=ray``) with ``--workers`` workers,
  batched, its rounds run as ``raysim run`` runs them (``RunSession.rounds``: batches of rounds
  per driver call, evaluation overlapped) with MLflow on (a fresh sqlite store);
- ``run``: the path ``raysim run`` takes for the quickstart (``runtime: auto`` finds nothing
  for Ray to run side by side, ``raysim.launch.without_ray``): the same ``RunSession.rounds``
  without
  Ray (``runtime=local``), MLflow on in its writer's process (a fresh store).

Steady-state per-round wall = median over rounds after the first 3, evaluation included (every
round in the quickstart). The goal of issue 23 is ``batched_vs_plain`` ≤ 0.5. ``--epochs 5`` is
the quickstart's own setting; the script runs it and, with ``--also-epochs``, others.

``--whole``: the Feddle mini and the FedBaF mini (its foundation pretrained first) as whole runs
in this process (every round, evaluation and server work included; no Ray start-up), batched
against sequential.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import QUICKSTART, ROOT, machine, report, steady
from overhead import run_plain, run_raysim

from raysim.actors.local import local_core
from raysim.config import RunConfig, load_config


def run_inprocess(cfg: RunConfig) -> tuple[list[float], np.ndarray]:
    torch.set_num_threads(1)
    core = local_core(cfg)
    walls = []
    while not core.done:
        t0 = time.perf_counter()
        core.step()
        walls.append(time.perf_counter() - t0)
    return walls, core.weights


def one_setting(args: argparse.Namespace, epochs: int) -> None:
    base = [
        f"rounds={args.rounds}",
        "delays.kind=none",
        f"local.epochs={epochs}",
        f"workers.group_size={args.group_size}",
    ]
    off = "tracking.enabled=false"  # in process; the Ray side logs to MLflow, as `raysim run`
    seq_cfg = load_config(QUICKSTART, [*base, off, "workers.execution=sequential"])
    bat_cfg = load_config(QUICKSTART, [*base, off, "workers.execution=batched"])
    ray_over = [f"workers.count={max(args.workers, 1)}", "workers.num_cpus=1"]
    store = Path(tempfile.mkdtemp()) / "mlflow.db"  # a fresh store
    ray_cfg = load_config(
        QUICKSTART,
        [*base, "workers.execution=batched", *ray_over, f"tracking.uri=sqlite:///{store}",
         "runtime=ray"],
    )  # fmt: skip
    run_store = store.with_name("run.db")
    run_cfg = load_config(QUICKSTART, [*base, f"tracking.uri=sqlite:///{run_store}",
                                       "runtime=local"])  # fmt: skip
    walls: dict[str, list[float]] = {
        k: [] for k in ("plain", "sequential", "batched", "ray", "run")
    }
    gap = 0.0
    for _ in range(args.repeats):
        walls["plain"].append(steady(run_plain(seq_cfg, 1)[0]))
        w, seq_weights = run_inprocess(seq_cfg)
        walls["sequential"].append(steady(w))
        w, bat_weights = run_inprocess(bat_cfg)
        walls["batched"].append(steady(w))
        gap = max(gap, float(np.abs(bat_weights - seq_weights).max()))
        walls["run"].append(steady(run_raysim(run_cfg, advance=True)[0]))
        if args.workers:
            walls["ray"].append(steady(run_raysim(ray_cfg, advance=True)[0]))
    med = {k: statistics.median(v) for k, v in walls.items() if v}
    report(f"epochs{epochs}.round_s", **med)
    report(f"epochs{epochs}.max_weight_gap_batched_vs_sequential", value=gap)
    ratios = {
        "batched_vs_plain": med["batched"] / med["plain"],
        "sequential_vs_plain": med["sequential"] / med["plain"],
    }
    ratios["run_vs_plain"] = med["run"] / med["plain"]
    if "ray" in med:
        ratios["ray_batched_vs_plain"] = med["ray"] / med["plain"]
    report(f"epochs{epochs}.ratio", **ratios)


def whole_runs(rounds: int | None, repeats: int) -> None:
    found = Path(tempfile.mkdtemp()) / "digits"
    cli = [sys.executable, "-m", "raysim.cli", "pretrain", "digits", "--out", str(found)]
    subprocess.run(cli, check=True, capture_output=True)
    cases = {
        "feddle_mini": (ROOT / "examples" / "feddle" / "mini.yaml", []),
        "fedbaf_mini": (
            ROOT / "examples" / "fedbaf" / "mini.yaml",
            [f"algorithm.foundation={found}"],
        ),
    }
    for name, (path, extra) in cases.items():
        over = ["tracking.enabled=false", *extra] + ([f"rounds={rounds}"] if rounds else [])
        seq, bat = [], []
        for _ in range(repeats):
            sequential = load_config(path, [*over, "workers.execution=sequential"])
            seq.append(sum(run_inprocess(sequential)[0]))
            bat.append(
                sum(run_inprocess(load_config(path, [*over, "workers.execution=batched"]))[0])
            )
        report(
            name,
            sequential_s=min(seq),
            batched_s=min(bat),
            batched_vs_sequential=min(bat) / min(seq),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1, help="Ray workers (0: no Ray run)")
    parser.add_argument("--also-epochs", type=int, nargs="*", default=[1])
    parser.add_argument("--whole", action="store_true", help="also the Feddle and FedBaF minis")
    parser.add_argument("--whole-rounds", type=int, default=None, help="default: the example's")
    args = parser.parse_args()
    print(f"machine={machine()}", flush=True)
    report("config", file=str(QUICKSTART.name), rounds=args.rounds, repeats=args.repeats,
           group_size=args.group_size, workers=args.workers)  # fmt: skip
    if args.workers:
        from raysim.launch.session import ensure_ray

        ensure_ray(num_cpus=args.workers)
    for epochs in (5, *args.also_epochs):
        one_setting(args, epochs)
    if args.whole:
        whole_runs(args.whole_rounds, args.repeats)


if __name__ == "__main__":
    main()
