"""Accuracy against ε for DP-FedAvg on Synthetic-IID with 10,000 clients (``dp_fedavg.yaml``).

Runs the config without privacy and at a few noise multipliers z, then audits the mechanism at a
few z with a one-run audit of canary clients (Steinke, Nasr and Jagielski 2023), and writes:

- ``accuracy-vs-epsilon.png``: test accuracy at each evaluation against the ε spent by then;
- two Markdown tables on stdout (and in ``--out``): final accuracy and ε of the trained runs;
  ε and the audit's empirical lower bound on ε, which must stay below the accountant's (the
  script fails where it does not).

    python examples/privacy/accuracy_vs_epsilon.py                       # about 5 min on 2 CPUs
    python examples/privacy/accuracy_vs_epsilon.py --noise 0.5,1,2 --rounds 50
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

HERE = Path(__file__).parent
CONFIG = HERE / "dp_fedavg.yaml"


#: the audit of the mechanism alone: no client trains (``local.epochs=0``), every one of 1,000
#: clients is a canary, so the model moves only by canaries and noise (each canary is sampled
#: about 10 times in 100 rounds): the setting in which a one-run audit can see most
MECHANISM_ONLY = ["clients.num=1000", "local.epochs=0", "privacy.audit.canaries=1000",
                  "eval.every=1000"]  # fmt: skip


def run_one(
    z: float | None, rounds: int, canaries: int, seed: int, extra: tuple[str, ...] = ()
) -> dict:
    """One run (``z`` None: without privacy), in this process: its per-round metrics."""
    from raysim.actors.local import local_core
    from raysim.config import load_config

    overrides = [f"rounds={rounds}", f"seed={seed}", "tracking.enabled=false"]
    if z is None:
        overrides.append("privacy.mode=none")
    else:
        overrides += [f"privacy.noise_multiplier={z}", f"privacy.audit.canaries={canaries}"]
    overrides += extra
    core = local_core(load_config(CONFIG, overrides), evaluate="local.epochs=0" not in extra)
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


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for r in runs:
        evals = [m for m in r["history"] if "accuracy" in m]
        if r["z"] is None:
            ax.axhline(evals[-1]["accuracy"], color="grey", ls="--", label="no privacy (final)")
            continue
        if r["z"] == 0:  # clipped and weighted as DP-FedAvg weighs, without noise: ε = ∞
            ax.axhline(evals[-1]["accuracy"], color="grey", ls=":", label="z = 0 (final)")
            continue
        ax.plot([m["dp_epsilon"] for m in evals], [m["accuracy"] for m in evals], "o-",
                label=f"z = {r['z']:g}")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("ε spent (δ = 1/N^1.1, RDP accountant)")
    ax.set_ylabel("test accuracy")
    ax.set_title("DP-FedAvg, Synthetic-IID, N = 10,000, S = 100, C = 0.1")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(runs: list[dict]) -> str:
    lines = ["| z | final accuracy | ε (accountant) |", "|---|---|---|"]
    for r in runs:
        f = r["final"]
        if r["z"] is None:
            lines.append(f"| no privacy | {f['accuracy']:.4f} | ∞ |")
        else:
            lines.append(f"| {r['z']:g} | {f['accuracy']:.4f} | {f['dp_epsilon']:.3g} |")
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
    ap.add_argument("--noise", default="0,0.5,1,2", help="noise multipliers z, comma-separated")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", type=Path, default=HERE / "accuracy-vs-epsilon.png")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument(
        "--part",
        choices=("trained", "mechanism", "both"),
        default="both",
        help="the trained runs, the audit of the mechanism alone, or both",
    )
    ap.add_argument("--audit-noise", default="0.3,1,2", help="z of the mechanism-only audits")
    args = ap.parse_args()
    texts = []
    if args.part in ("trained", "both"):
        texts.append(trained(args))
    if args.part in ("mechanism", "both"):
        runs = [run_one(float(z), args.rounds, 0, args.seed, tuple(MECHANISM_ONLY))
                for z in args.audit_noise.split(",")]  # fmt: skip
        check(runs)
        texts.append(audit_table(runs))
    text = "\n\n".join(texts)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def trained(args: argparse.Namespace) -> str:
    """The trained runs, without privacy and at each z: the plot and the table."""
    zs: list[float | None] = [None, *(float(z) for z in args.noise.split(","))]
    runs = []
    for z in zs:
        r = run_one(z, args.rounds, 0, args.seed)
        runs.append(r)
        label = "no privacy" if z is None else f"z={z:g}"
        print(f"{label}: accuracy {r['final']['accuracy']:.4f}, {r['seconds']:.0f} s", flush=True)
    plot(runs, args.plot)
    return table(runs)


if __name__ == "__main__":
    main()
