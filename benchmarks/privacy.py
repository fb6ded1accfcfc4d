"""What differential privacy costs a run (``privacy:``), as ratios measured in this one script.

1. A DP-FedAvg round against the same round without privacy: the quickstart workload (FedAvg,
   digits, 10 clients a round, 5 local epochs), batched clients, in this process. Privacy adds a
   clip per client on the worker (inside the batched groups) and one Gaussian draw per sum at the
   server. Rounds alternate between the two runs, so that this machine's drift hits both alike;
   the figure is the ratio of their median round walls (issue 59 asks for ≤ 1.15).
2. The accountant: the mean wall of one ``Accountant.step()`` over 1,000 aggregations, for fixed
   size sampling (RDP) and Poisson sampling (RDP, PLD), against the same run's median round wall
   (issue 59 asks for ≤ 5 ms a round).
3. Sample-level DP-SGD in one client (``local.dp_sgd``): raysim's ``train_local`` (per-example
   gradients by ``torch.func``) against Opacus's ``GradSampleModule`` with its ``DPOptimizer``
   (per-example gradients by module hooks), the same model (the quickstart's MLP, 64-128-10, which
   raysim clips by the outer-product rule; and a small CNN, whose convolution raysim takes from its
   unfolded input),
   the same client (500 examples), the same number of steps and batch sizes, clip and noise; the
   two alternate, and the figure is the ratio of their median walls (issue 59 asks for ≤ 1, at
   least as fast as Opacus).

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


def dp_sgd_walls(
    batch: int, steps: int, repeats: int, model: str = "mlp"
) -> dict[str, list[float]]:
    """Walls of ``steps`` DP-SGD steps on one client: raysim's and Opacus's, alternating.
    ``model``: the quickstart's MLP (raysim's outer-product rule) or a small CNN on the same
    64 features as 8×8 images (raysim's unfolded-convolution rule)."""
    import torch
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer
    from torch import nn

    from raysim.training.loop import train_local
    from raysim.training.settings import LocalTrainingConfig
    from raysim.training.tasks import ClassificationTask

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(500, 64, generator=g), torch.randint(0, 10, (500,), generator=g)
    if model == "cnn":
        x = x.view(500, 1, 8, 8)

    def mlp() -> nn.Module:
        torch.manual_seed(1)
        if model == "cnn":
            return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Flatten(),
                                 nn.Linear(16 * 6 * 6, 10))  # fmt: skip
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    cfg = LocalTrainingConfig(sampling="independent", max_steps=steps, batch_size=batch, lr=0.05,
                              dp_sgd={"clip": 1.0, "noise_multiplier": 1.0})  # fmt: skip

    def ours() -> None:
        model = mlp()
        train_local(model, list(model.parameters()), ClassificationTask(), (x, y), cfg,
                    torch.Generator().manual_seed(2))  # fmt: skip

    def opacus() -> None:
        model = GradSampleModule(mlp())
        opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), noise_multiplier=1.0,
                          max_grad_norm=1.0, expected_batch_size=batch)  # fmt: skip
        shuffle = torch.Generator().manual_seed(2)
        for _ in range(steps):
            idx = torch.randperm(500, generator=shuffle)[:batch]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()

    walls: dict[str, list[float]] = {"raysim": [], "opacus": []}
    ours(), opacus()  # warm-up: imports, first kernels
    for _ in range(repeats):
        for name, fn in (("raysim", ours), ("opacus", opacus)):
            t0 = time.perf_counter()
            fn()
            walls[name].append(time.perf_counter() - t0)
    return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1000, help="aggregations the accountant counts")
    ap.add_argument("--dp-sgd-steps", type=int, default=100, help="DP-SGD steps of one client")
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
    for model, batch in (("mlp", 10), ("mlp", 64), ("cnn", 10), ("cnn", 64)):
        walls = dp_sgd_walls(batch, args.dp_sgd_steps, max(args.repeats, 5), model)
        ours, theirs = statistics.median(walls["raysim"]), statistics.median(walls["opacus"])
        report(f"dp_sgd.{model}.batch{batch}", steps=args.dp_sgd_steps, raysim_median_s=ours,
               opacus_median_s=theirs, raysim_over_opacus=ours / theirs)  # fmt: skip


if __name__ == "__main__":
    main()
