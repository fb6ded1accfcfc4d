"""Accuracy (or loss) against ε for DP-FedAvg's mechanism, on two workloads:

- ``synthetic`` (``dp_fedavg.yaml``): FedAvg on Synthetic-IID with 10,000 clients;
- ``fedit`` (``dp_fedit.yaml``): FedIT's LoRA adapters on the tiny foundation LLaMA and
  Flan-mini, 180 clients (it needs ``raysim pretrain tiny-llama --out foundations/tiny-s0``).

Runs the config without privacy and at a few noise multipliers z, then (``synthetic``) audits the
mechanism at a few z with a one-run audit of canary clients (Steinke, Nasr and Jagielski 2023),
and writes:

- a plot (``accuracy-vs-epsilon.png``, ``fedit-loss-vs-epsilon.png``): the workload's metric at
  each evaluation against the ε spent by then;
- Markdown tables on stdout (and in ``--out``): the final metrics and ε of the trained runs; ε
  and the audit's empirical lower bound on ε, which must stay below the accountant's (the script
  fails where it does not).

    python examples/privacy/accuracy_vs_epsilon.py                       # about 5 min on 2 CPUs
    python examples/privacy/accuracy_vs_epsilon.py --noise 0.5,1,2 --rounds 50
    python examples/privacy/accuracy_vs_epsilon.py --workload fedit      # about 6 min
    python examples/privacy/accuracy_vs_epsilon.py --part trained --noise 1,2 \
        --set privacy.secure_aggregation.enabled=true \
        --set privacy.secure_aggregation.noise=skellam            # distributed DP
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Workload:
    """A config, the metric its curve plots, its final columns and its plot's title."""

    config: Path
    metric: str
    label: str
    columns: tuple[tuple[str, str], ...]
    title: str
    plot: Path
    legend: str = "best"


WORKLOADS = {
    "synthetic": Workload(
        HERE / "dp_fedavg.yaml", "accuracy", "test accuracy", (("final accuracy", "accuracy"),),
        "DP-FedAvg, Synthetic-IID, N = 10,000, S = 100, C = 0.1",
        HERE / "accuracy-vs-epsilon.png",
    ),
    "fedit": Workload(
        HERE / "dp_fedit.yaml", "id_loss", "held-in test loss (ID)",
        (("ID loss", "id_loss"), ("ID ROUGE-1", "id_rouge1"), ("OOD loss", "ood_loss")),
        "DP-FedIT (LoRA r = 8, tiny LLaMA), N = 180, S = 30, C = 0.3",
        HERE / "fedit-loss-vs-epsilon.png",
        "upper center",
    ),
}  # fmt: skip


#: the audit of the mechanism alone: no client trains (``local.epochs=0``), every one of 1,000
#: clients is a canary, so the model moves only by canaries and noise (each canary is sampled
#: about 10 times in 100 rounds): the setting in which a one-run audit can see most
MECHANISM_ONLY = ["clients.num=1000", "local.epochs=0", "privacy.audit.canaries=1000",
                  "eval.every=1000"]  # fmt: skip


def run_one(
    z: float | None,
    rounds: int | None,
    canaries: int,
    seed: int,
    extra: tuple[str, ...] = (),
    config: Path = WORKLOADS["synthetic"].config,
) -> dict:
    """One run (``z`` None: without privacy), in this process: its per-round metrics."""
    from raysim.actors.local import local_core
    from raysim.config import load_config

    overrides = [f"seed={seed}", "tracking.enabled=false"]
    overrides += [f"rounds={rounds}"] if rounds is not None else []
    if z is None:
        overrides.append("privacy.mode=none")
    else:
        overrides += [f"privacy.noise_multiplier={z}", f"privacy.audit.canaries={canaries}"]
    overrides += extra
    core = local_core(load_config(config, overrides), evaluate="local.epochs=0" not in extra)
    t0 = time.perf_counter()
    while not core.done:
        core.step()
    core.settle()
    return {
        "z": z,
        "history": core.history,
        "final": core.final_metrics(),
        "seconds": time.perf_counter() - t0,
    }


def plot(runs: list[dict], work: Workload, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    key = work.metric
    for r in runs:
        evals = [m for m in r["history"] if key in m]
        if r["z"] is None:
            ax.axhline(evals[-1][key], color="grey", ls="--", label="no privacy (final)")
            continue
        if r["z"] == 0:  # clipped and weighted as DP-FedAvg weighs, without noise: ε = ∞
            ax.axhline(evals[-1][key], color="grey", ls=":", label="z = 0 (final)")
            continue
        ax.plot([m["dp_epsilon"] for m in evals], [m[key] for m in evals], "o-",
                label=f"z = {r['z']:g}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("ε spent (δ = 1/N^1.1, RDP accountant)")
    ax.set_ylabel(work.label)
    ax.set_title(work.title)
    ax.legend(loc=work.legend)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(runs: list[dict], work: Workload) -> str:
    heads = " | ".join(name for name, _ in work.columns)
    lines = [f"| z | {heads} | ε (accountant) |", "|---|" + "---|" * (len(work.columns) + 1)]
    for r in runs:
        f = r["final"]
        values = " | ".join(f"{f[key]:.4f}" for _, key in work.columns)
        if r["z"] is None:
            lines.append(f"| no privacy | {values} | ∞ |")
        else:
            lines.append(f"| {r['z']:g} | {values} | {f['dp_epsilon']:.3g} |")
    return "\n".join(lines)


def audit_table(runs: list[dict]) -> str:
    lines = [
        "| z | ε (accountant) | ε lower bound (audit) | audit guesses correct |",
        "|---|---|---|---|",
    ]
    for r in runs:
        f = r["final"]
        lines.append(
            f"| {r['z']:g} | {f['dp_epsilon']:.4g} | {f['dp_audit_epsilon_lower_bound']:.3g} | "
            f"{f['dp_audit_correct']:.0f} / {f['dp_audit_guesses']:.0f} |"
        )
    return "\n".join(lines)


def check(runs: list[dict]) -> None:
    """The claim the audit checks: its lower bound never above the accountant's ε."""
    for r in runs:
        f = r["final"]
        if r["z"] is not None and f["dp_audit_epsilon_lower_bound"] > f["dp_epsilon"]:
            raise SystemExit(f"z={r['z']}: the audit's lower bound exceeds the accountant's ε")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="synthetic")
    ap.add_argument("--noise", default="0,0.5,1,2", help="noise multipliers z, comma-separated")
    ap.add_argument("--rounds", type=int, default=None, help="default: the config's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--foundation", type=Path, default=Path("foundations/tiny-s0"),
                    help="fedit: the tiny LLaMA from raysim pretrain tiny-llama")  # fmt: skip
    ap.add_argument("--plot", type=Path, default=None, help="default: the workload's")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument(
        "--part",
        choices=("trained", "mechanism", "both"),
        default="both",
        help="the trained runs, the audit of the mechanism alone, or both",
    )
    ap.add_argument("--audit-noise", default="0.3,1,2", help="z of the mechanism-only audits")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every private run (repeatable)")  # fmt: skip
    args = ap.parse_args()
    work = WORKLOADS[args.workload]
    extra: tuple[str, ...] = ()
    if args.workload == "fedit":
        if not (args.foundation / "config.json").is_file():
            raise SystemExit(
                f"no tiny LLaMA at {args.foundation}: run `raysim pretrain tiny-llama --out "
                f"{args.foundation}` first, or name one with --foundation"
            )
        extra = (f"model.path={args.foundation}", f"data.text.tokenizer={args.foundation}")
        if args.part != "trained":
            args.part = "trained"  # the audit runs on the synthetic workload
    texts = []
    if args.part in ("trained", "both"):
        texts.append(trained(args, work, extra))
    if args.part in ("mechanism", "both"):
        runs = [run_one(float(z), args.rounds, 0, args.seed, tuple(MECHANISM_ONLY))
                for z in args.audit_noise.split(",")]  # fmt: skip
        check(runs)
        texts.append(audit_table(runs))
    text = "\n\n".join(texts)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def trained(args: argparse.Namespace, work: Workload, extra: tuple[str, ...] = ()) -> str:
    """The trained runs, without privacy and at each z: the plot and the table."""
    zs: list[float | None] = [None, *(float(z) for z in args.noise.split(","))]
    runs = []
    for z in zs:
        private = () if z is None else tuple(args.set)
        r = run_one(z, args.rounds, 0, args.seed, (*extra, *private), work.config)
        runs.append(r)
        label = "no privacy" if z is None else f"z={z:g}"
        print(f"{label}: {work.metric} {r['final'][work.metric]:.4f}, {r['seconds']:.0f} s",
              flush=True)  # fmt: skip
    plot(runs, work, args.plot or work.plot)
    return table(runs, work)


if __name__ == "__main__":
    main()
