"""The qualitative mini reproduction of FedOA (fedoa.md §7.1 tier T2) on the tiny foundation LLaMA.

Runs every method preset below for each seed under one MLflow parent run (reading comprehension
held out), then checks the spec's directional claims on the mean over seeds and writes a Markdown
report with the measured numbers (nothing here is copied from the papers).

    raysim pretrain tiny-llama --out foundations/tiny-s0          # once, about 5 min on 2 CPUs
    python examples/fedoa/qualitative.py --seeds 0,1 --out runs/qualitative

``--quick`` shrinks the data and rounds for a fast look (not the T2 budget).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from raysim.api import ensure_ray
from raysim.protocols import TABLE2_METHODS, leave_one_out

HERE = Path(__file__).parent
CONFIG = HERE / "qualitative.yaml"

#: label -> overrides of qualitative.yaml (which is FedOA, λ = 0.5, L2)
METHODS: dict[str, list[str]] = {
    "zero_shot": ["algorithm={name: fedit}", "rounds=1", "local.epochs=0", "eval.every=1"],
    "centralized": [*TABLE2_METHODS["centralized"], "eval.every=1"],
    "fedit": ["algorithm={name: fedit}"],
    "local_only": ["algorithm={name: local_only}"],
    "fedlora": ["algorithm={name: fedlora}"],
    "perada": ["algorithm={name: perada}"],
    "pfedme": ["algorithm={name: pfedme, inner_steps: 2}"],
    "fedsdr": ["algorithm={name: fedsdr}"],
    "ditto": ["algorithm={name: ditto}"],
    "fedoa_l0": ["algorithm.lambda=0"],
    "fedoa_l0.1": ["algorithm.lambda=0.1"],
    "fedoa_l0.5": [],
    "fedoa_l2": ["algorithm.lambda=2"],
    "fedoa_cosine": ["algorithm.distance=cosine"],
    "fedoa_pearson": ["algorithm.distance=pearson"],
}
QUICK = ["data.text.n_train=64", "data.text.n_test=16", "rounds=4", "eval.every=2"]
PERSONALIZED = ["local_only", "fedlora", "perada", "pfedme", "fedsdr", "ditto", "fedoa_l0.5"]
LAMBDAS = {"fedoa_l0": 0.0, "fedoa_l0.1": 0.1, "fedoa_l0.5": 0.5, "fedoa_l2": 2.0}


def _curve(history: list[dict], key: str) -> list[float]:
    return [h[key] for h in history if key in h and math.isfinite(h[key])]


def summarize(results: dict, seeds: list[str], methods: list[str]) -> dict[str, dict[str, float]]:
    """Per method, the mean over seeds of the final metrics and feature-distance figures."""
    out: dict[str, dict[str, float]] = {}
    for m in methods:
        rows = []
        for s in seeds:
            res = results[(s, m)]
            row = {k: v for k, v in res.metrics.items() if isinstance(v, float)}
            dist = _curve(res.history, "client_feature_distance")
            if dist:
                row["fd_first"], row["fd_last"] = dist[0], dist[-1]
                row["fd_ratio"] = dist[-1] / dist[0] if dist[0] > 0 else float("nan")
            rows.append(row)
        keys = set.intersection(*(set(r) for r in rows))
        out[m] = {k: float(np.mean([r[k] for r in rows])) for k in sorted(keys)}
    return out


def claims(t: dict[str, dict[str, float]]) -> list[tuple[str, bool | None, str]]:
    """The §7.1 checks: (claim, held?, the numbers behind it); None = report only."""
    ood = {m: v.get("ood_rouge1", float("nan")) for m, v in t.items()}
    idr = {m: v.get("id_rouge1", float("nan")) for m, v in t.items()}
    out: list[tuple[str, bool | None, str]] = []
    gate = ood["fedit"] - ood["zero_shot"]
    out.append(
        (
            "Sanity gate: FedIT OOD ≥ frozen base zero-shot + 5",
            gate >= 5,
            f"FedIT {ood['fedit']:.2f} vs zero-shot {ood['zero_shot']:.2f} ({gate:+.2f})",
        )
    )
    d = ood["fedoa_l0.5"] - ood["local_only"]
    out.append(
        (
            "1a. FedOA(0.5) − Local-only ≥ +5 OOD ROUGE-1",
            d >= 5,
            f"{ood['fedoa_l0.5']:.2f} − {ood['local_only']:.2f} = {d:+.2f}",
        )
    )
    out.append(
        (
            "1b. FedOA(0.5) ≥ FedLoRA − 1 (OOD)",
            ood["fedoa_l0.5"] >= ood["fedlora"] - 1,
            f"{ood['fedoa_l0.5']:.2f} vs FedLoRA {ood['fedlora']:.2f}",
        )
    )
    order = sorted(
        ["fedit", "fedoa_l0.5", "fedlora", "perada", "pfedme", "local_only", "fedoa_l0", "fedsdr"],
        key=lambda m: -ood[m],
    )
    out.append(
        (
            "1c. Expected OOD order FedIT ≈ FedOA(≥0.5) > FedLoRA > {PERADA, pFedMe, Local-only, "
            "FedOA(0)} ≥ FedSDR (report)",
            None,
            "measured: " + " > ".join(f"{m} {ood[m]:.1f}" for m in order),
        )
    )
    lam = [ood[m] for m in LAMBDAS]
    drops = [a - b for a, b in zip(lam, lam[1:], strict=False) if b < a]
    ok = len(drops) <= 1 and all(x <= 1 for x in drops)
    out.append(
        (
            "2a. FedOA OOD ROUGE-1 non-decreasing in λ ∈ {0, 0.1, 0.5, 2} (one inversion ≤ 1)",
            ok,
            ", ".join(f"λ={v}: {ood[m]:.2f}" for m, v in LAMBDAS.items()),
        )
    )
    fd = [t[m].get("fd_last", float("nan")) for m in LAMBDAS]
    out.append(
        (
            "2b. Final mean feature distance decreasing in λ",
            all(b < a for a, b in zip(fd, fd[1:], strict=False)),
            ", ".join(f"λ={v}: {x:.4g}" for v, x in zip(LAMBDAS.values(), fd, strict=True)),
        )
    )
    r_oa, r_lo = t["fedoa_l0.5"].get("fd_ratio"), t["local_only"].get("fd_ratio")
    out.append(
        (
            "3. Feature distance final/initial: FedOA(0.5) < Local-only",
            None if r_oa is None or r_lo is None else r_oa < r_lo,
            f"FedOA {r_oa:.3g} vs Local-only {r_lo:.3g}" if r_oa and r_lo else "not logged",
        )
    )
    below = [m for m in PERSONALIZED if idr[m] < idr["fedit"] - 1]
    out.append(
        (
            "4a. Every personalized method's ID ROUGE-1 ≥ FedIT − 1",
            not below,
            f"FedIT {idr['fedit']:.2f}; "
            + ", ".join(f"{m} {idr[m]:.2f}" for m in PERSONALIZED)
            + (f" (below: {', '.join(below)})" if below else ""),
        )
    )
    best = max(idr[m] for m in PERSONALIZED)
    out.append(
        (
            "4b. FedOA(0.5) ID within 3 of the best personalized method",
            idr["fedoa_l0.5"] >= best - 3,
            f"FedOA {idr['fedoa_l0.5']:.2f}, best {best:.2f}",
        )
    )
    out.append(
        (
            "5. Report only: FedIT vs Centralized (OOD); L2 vs cosine vs Pearson (FedOA OOD/ID)",
            None,
            f"FedIT {ood['fedit']:.2f} vs Centralized {ood['centralized']:.2f}; "
            + ", ".join(
                f"{m.split('_')[1]} {ood[m]:.2f}/{idr[m]:.2f}"
                for m in ("fedoa_l0.5", "fedoa_cosine", "fedoa_pearson")
            ),
        )
    )
    return out


def report(t: dict, checks: list, seeds: list[str], parent: str | None, wall: float) -> str:
    cols = [
        ("ood_rouge1", "OOD R-1 (routed)"),
        ("ood_rouge1_global", "OOD R-1 (global)"),
        ("id_rouge1", "ID R-1"),
        ("ood_loss", "OOD loss"),
        ("fd_first", "feat. dist. first"),
        ("fd_last", "feat. dist. last"),
    ]
    lines = [
        f"Mean over seeds {', '.join(seeds)}; MLflow parent run `{parent}`; "
        f"{wall / 60:.1f} min wall.\n",
        "| method | " + " | ".join(c for _, c in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for m, v in t.items():
        cells = [f"{v[k]:.2f}" if k in v else "—" for k, _ in cols]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    lines += ["", "| claim (fedoa.md §7.1) | held? | measured |", "|---|---|---|"]
    for text, held, numbers in checks:
        mark = "report" if held is None else ("yes" if held else "**no**")
        lines.append(f"| {text} | {mark} | {numbers} |")
    return "\n".join(lines) + "\n"


def _metric_table(res, metric: str) -> str:
    head = "| method | " + " | ".join(res.settings) + " |"
    lines = [head, "|---" * (len(res.settings) + 1) + "|"]
    for m in res.methods:
        vals = [res.results[(s, m)].metrics.get(metric, float("nan")) for s in res.settings]
        lines.append(f"| {m} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    return "\n".join(lines) + "\n"


CURVES = {
    "client_feature_distance": "mean feature distance, personal vs global (Fig. 2)",
    "ood_rouge1": "OOD ROUGE-1, routed adapters (Fig. 1)",
}
CURVE_METHODS = ["fedit", "local_only", "perada", "ditto", "fedoa_l0.1", "fedoa_l0.5", "fedoa_l2"]


def plot_curves(parents: list[str], path: Path) -> None:
    """Per-round curves from the MLflow children of ``parents``, averaged over them (seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlflow.tracking import MlflowClient

    from raysim.tracking import default_tracking_uri

    client = MlflowClient(default_tracking_uri())
    curves: dict[str, dict[str, dict[int, list[float]]]] = {k: {} for k in CURVES}
    for parent in parents:
        exp = client.get_run(parent).info.experiment_id
        children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'")
        for child in children:
            method = child.data.tags.get("method")
            if method not in CURVE_METHODS:
                continue
            for key in CURVES:
                by_step = curves[key].setdefault(method, {})
                for m in client.get_metric_history(child.info.run_id, key):
                    by_step.setdefault(m.step, []).append(m.value)
    fig, axes = plt.subplots(1, len(CURVES), figsize=(11, 3.8), dpi=100)
    for ax, (key, title) in zip(axes, CURVES.items(), strict=True):
        for i, method in enumerate(CURVE_METHODS):
            by_step = curves[key].get(method)
            if by_step:
                steps = sorted(by_step)
                y = [np.mean(by_step[s]) for s in steps]
                ax.plot(steps, y, marker="o", color=f"C{i}", label=method)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
        ax.set_yscale("log" if key == "client_feature_distance" else "linear")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def combine(dirs: list[str], out: Path) -> None:
    """Average the per-method tables of several runs (``--seeds`` done separately) and report."""
    tables = [json.loads((Path(d) / "qualitative.json").read_text()) for d in dirs]
    metas = [json.loads((Path(d) / "meta.json").read_text()) for d in dirs]
    seeds = [s for m in metas for s in m["seeds"]]
    parents = [m["parent_run_id"] for m in metas]
    wall = sum(m["wall_s"] for m in metas)
    methods = list(tables[0])
    table = {}
    for m in methods:
        keys = set.intersection(*(set(t[m]) for t in tables))
        table[m] = {k: float(np.mean([t[m][k] for t in tables])) for k in sorted(keys)}
    checks = claims(table) if set(METHODS) <= set(methods) else []
    text = report(table, checks, seeds, ", ".join(map(str, parents)), wall)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qualitative.md").write_text(text)
    (out / "qualitative.json").write_text(json.dumps(table, indent=2))
    plot_curves(parents, out / "curves.png")
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="0")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--out", default="runs/qualitative")
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--held-out",
        default=None,
        help="comma-separated task families: a leave-one-task-out table (first seed only)",
    )
    p.add_argument("overrides", nargs="*")
    p.add_argument(
        "--combine",
        default=None,
        help="comma-separated output dirs of earlier runs (e.g. one per seed): average their "
        "qualitative.json files and report, running nothing",
    )
    args = p.parse_args()
    if args.combine:
        combine(args.combine.split(","), Path(args.out))
        return
    seeds = args.seeds.split(",")
    methods = {m: METHODS[m] for m in args.methods.split(",")}
    overrides = [*(QUICK if args.quick else []), *args.overrides]
    started = time.perf_counter()
    ensure_ray()  # one local Ray for every run (each run would otherwise start its own)

    def progress(seed: str, label: str, res) -> None:
        m = res.metrics
        print(
            f"seed {seed} {label:>14}: OOD {m.get('ood_rouge1', float('nan')):6.2f}  "
            f"ID {m.get('id_rouge1', float('nan')):6.2f}  ({m['wall_time_s']:.0f} s)",
            flush=True,
        )

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.held_out:
        res = leave_one_out(
            CONFIG,
            [*overrides, f"seed={seeds[0]}"],
            settings=args.held_out.split(","),
            methods=methods,
            name="fedoa-qualitative-loto",
            on_run=lambda s, label, r: progress(f"{seeds[0]} held-out {s}", label, r),
        )
        text = f"MLflow parent run `{res.parent_run_id}`\n\nOOD ROUGE-1 (routed)\n\n"
        text += res.markdown() + "\nID ROUGE-1\n\n" + _metric_table(res, "id_rouge1")
        (out / "loto.md").write_text(text)
        print(text)
        return
    res = leave_one_out(
        CONFIG,
        overrides,
        key="seed",
        settings=seeds,
        methods=methods,
        name="fedoa-qualitative-T2",
        on_run=progress,
    )
    table = summarize(res.results, seeds, list(methods))
    wall = time.perf_counter() - started
    text = report(
        table, claims(table) if len(methods) == len(METHODS) else [], seeds, res.parent_run_id, wall
    )
    (out / "qualitative.md").write_text(text)
    (out / "qualitative.json").write_text(json.dumps(table, indent=2))
    meta = {"seeds": seeds, "parent_run_id": res.parent_run_id, "wall_s": wall}
    (out / "meta.json").write_text(json.dumps(meta))
    if res.parent_run_id:
        plot_curves([res.parent_run_id], out / "curves.png")
    print(text)


if __name__ == "__main__":
    main()
