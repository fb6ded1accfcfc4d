"""FedOA's qualitative mini reproduction (FedOA spec §7.1 tier T2) on the tiny foundation LLaMA.

Runs every method preset below for each seed under one MLflow parent run (reading comprehension
held out), then decides the spec's directional claims with ``raysim.verdicts`` (paired by seed,
95 % intervals; issue 45) and writes a Markdown report with the measured numbers (nothing here
is copied from the papers), listing the verdicts that changed from the committed RESULTS.md.

    raysim pretrain tiny-llama --out foundations/tiny-s0     # once, ~15 min of one core (portable)
    python examples/fedoa/qualitative.py --seeds 0,1,2 --out runs/qualitative   # ~25 min a seed

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
from raysim.sweeps.protocols import TABLE2_METHODS, leave_one_out
from raysim.verdicts import HELD, INCONCLUSIVE, NOT_HELD, RULES, Paired, Summary, all_of

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


def per_seed(results: dict, seeds: list[str], methods: list[str]) -> dict[str, list[dict]]:
    """Per method, one row per seed (in ``seeds``' order) of final metrics and feature-distance
    figures."""
    out: dict[str, list[dict]] = {}
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
        out[m] = rows
    return out


def means(rows: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Per method, the mean over seeds of every figure all its seeds have."""
    out = {}
    for m, seeds in rows.items():
        keys = set.intersection(*(set(r) for r in seeds))
        out[m] = {k: float(np.mean([r[k] for r in seeds])) for k in sorted(keys)}
    return out


#: FedOA spec §7.1's sanity gate: FedIT's held-out ROUGE-1 at least this far above zero-shot
GATE_MARGIN = 5.0
GATE = "Sanity gate: FedIT OOD − frozen base zero-shot > +5"


def claims(rows: dict[str, list[dict]]) -> list[tuple[str, str, str]]:
    """The §7.1 checks with ``raysim.verdicts`` (paired by seed, or by whatever unit ``rows``
    lists: ``nested_claims`` passes foundations): (claim, verdict, the numbers behind it); the
    verdict "report" where the spec asks for no decision; every claim void where the gate
    (the first) is not held."""
    gate = Paired.of(
        _col(rows, "fedit", "ood_rouge1"), _col(rows, "zero_shot", "ood_rouge1"), GATE_MARGIN
    )
    t = means(rows)
    means_text = f"FedIT {t['fedit']['ood_rouge1']:.2f} vs zero-shot "
    means_text += f"{t['zero_shot']['ood_rouge1']:.2f}"
    first = (GATE, gate.verdict, f"{means_text}: {gate.text(digits=2)}")
    return void_after_gate([first, *later_claims(rows)])


def _col(rows: dict[str, list[dict]], m: str, key: str) -> list[float]:
    return [r.get(key, float("nan")) for r in rows[m]]


def later_claims(rows: dict[str, list[dict]]) -> list[tuple[str, str, str]]:
    """The claims after the gate (1a to 5), paired by the units ``rows`` lists."""

    def cmp(a: str, b: str, key: str, margin: float = 0.0, greater: bool = True) -> Paired:
        return Paired.of(_col(rows, a, key), _col(rows, b, key), margin, greater)

    t = means(rows)
    ood = {m: v.get("ood_rouge1", float("nan")) for m, v in t.items()}
    idr = {m: v.get("id_rouge1", float("nan")) for m, v in t.items()}
    out: list[tuple[str, str, str]] = []
    d = cmp("fedoa_l0.5", "local_only", "ood_rouge1", 5)
    out.append(("1a. FedOA(0.5) − Local-only > +5 OOD ROUGE-1", d.verdict, d.text(digits=2)))
    d = cmp("fedoa_l0.5", "fedlora", "ood_rouge1", -1)
    out.append(("1b. FedOA(0.5) − FedLoRA > −1 (OOD)", d.verdict, d.text(digits=2)))
    order = sorted(
        ["fedit", "fedoa_l0.5", "fedlora", "perada", "pfedme", "local_only", "fedoa_l0", "fedsdr"],
        key=lambda m: -ood[m],
    )
    out.append(
        (
            "1c. Expected OOD order FedIT ≈ FedOA(≥0.5) > FedLoRA > {PERADA, pFedMe, Local-only, "
            "FedOA(0)} ≥ FedSDR",
            "report",
            "measured (means): " + " > ".join(f"{m} {ood[m]:.1f}" for m in order),
        )
    )
    lam = list(LAMBDAS)
    steps = [cmp(b, a, "ood_rouge1", -1) for a, b in zip(lam, lam[1:], strict=False)]
    out.append(
        (
            "2a. FedOA's OOD ROUGE-1 is non-decreasing in λ ∈ {0, 0.1, 0.5, 2}, allowing one "
            "inversion of at most 1 point",
            non_decreasing(steps),
            "; ".join(
                f"λ {LAMBDAS[a]}→{LAMBDAS[b]}: {s.text(digits=2)}"
                for a, b, s in zip(lam, lam[1:], steps, strict=False)
            )
            + f"; inversions (a step's mean below 0): {sum(s.mean < 0 for s in steps)}",
        )
    )
    steps = [cmp(b, a, "fd_last", 0, greater=False) for a, b in zip(lam, lam[1:], strict=False)]
    out.append(
        (
            "2b. Final mean feature distance falls from each λ to the next",
            all_of([s.verdict for s in steps]),
            "; ".join(
                f"λ {LAMBDAS[a]}→{LAMBDAS[b]}: {s.text(digits=3)}"
                for a, b, s in zip(lam, lam[1:], steps, strict=False)
            ),
        )
    )
    if all("fd_ratio" in r for m in ("fedoa_l0.5", "local_only") for r in rows[m]):
        d = cmp("fedoa_l0.5", "local_only", "fd_ratio", 0, greater=False)
        out.append(("3. Feature distance final/initial: FedOA(0.5) − Local-only < 0", d.verdict,
                    d.text(digits=3)))  # fmt: skip
    else:
        out.append(("3. Feature distance final/initial: FedOA(0.5) < Local-only",
                    INCONCLUSIVE, "not logged"))  # fmt: skip
    parts = {m: cmp(m, "fedit", "id_rouge1", -1) for m in PERSONALIZED}
    out.append(
        (
            "4a. Every personalized method's ID ROUGE-1 − FedIT > −1",
            all_of([d.verdict for d in parts.values()]),
            f"FedIT {idr['fedit']:.2f}; "
            + "; ".join(f"{m}: {d.text(digits=2)} ({d.verdict})" for m, d in parts.items()),
        )
    )
    best = max(PERSONALIZED, key=lambda m: idr[m])
    d = cmp("fedoa_l0.5", best, "id_rouge1", -3)
    out.append(
        (
            "4b. FedOA(0.5) ID − the best personalized method's (by mean) > −3",
            d.verdict,
            f"best: {best} {idr[best]:.2f}; {d.text(digits=2)}",
        )
    )
    out.append(
        (
            "5. FedIT vs Centralized (OOD); L2 vs cosine vs Pearson (FedOA OOD/ID)",
            "report",
            f"FedIT {ood['fedit']:.2f} vs Centralized {ood['centralized']:.2f}; "
            + ", ".join(
                f"{m.split('_')[1]} {ood[m]:.2f}/{idr[m]:.2f}"
                for m in ("fedoa_l0.5", "fedoa_cosine", "fedoa_pearson")
            ),
        )
    )
    return out


def foundation_means(by_foundation: dict[str, dict[str, list[dict]]]) -> dict[str, list[dict]]:
    """Per method, one row per foundation (in ``by_foundation``'s order): the mean over that
    foundation's seeds of every figure they all have."""
    methods = set.intersection(*(set(rows) for rows in by_foundation.values()))
    return {
        m: [means({m: rows[m]})[m] for rows in by_foundation.values()]
        for m in METHODS
        if m in methods
    }


def gate_gaps(by_foundation: dict[str, dict[str, list[dict]]]) -> dict[str, float]:
    """Per foundation, the sanity gate's measure on the mean of its seeds: FedIT's OOD ROUGE-1
    minus the frozen base's (it passes above ``GATE_MARGIN``)."""
    gaps = {}
    for name, rows in by_foundation.items():
        t = means({m: rows[m] for m in ("fedit", "zero_shot")})
        gaps[name] = t["fedit"]["ood_rouge1"] - t["zero_shot"]["ood_rouge1"]
    return gaps


def nested_claims(by_foundation: dict[str, dict[str, list[dict]]]) -> list[tuple[str, str, str]]:
    """The claims with the foundation as a random factor (issue 62; ``RANDOM_FACTOR``): the gate
    per foundation on its seeds' mean, then every later claim over the foundations that pass it,
    paired by foundation (t with F − 1 degrees of freedom, sign flips over F); void where fewer
    than two pass."""
    if len(by_foundation) < 2:
        raise ValueError(
            f"the foundation is a random factor: 2+ foundations are needed, got "
            f"{len(by_foundation)}"
        )
    gaps = gate_gaps(by_foundation)
    passing = [f for f, g in gaps.items() if g > GATE_MARGIN]
    gate_text = "; ".join(f"{f} {g:+.2f}" for f, g in gaps.items())
    verdict = HELD if len(passing) == len(gaps) else f"held on {len(passing)} of {len(gaps)}"
    first = (
        "Sanity gate, per foundation: FedIT OOD − frozen base zero-shot > +5 on the mean of its "
        "seeds",
        verdict,
        f"FedIT − zero-shot by foundation: {gate_text}",
    )
    if len(passing) < 2:
        rest = later_claims(foundation_means(by_foundation))
        why = f"void (gate held on {len(passing)} of {len(gaps)} foundations)"
        return [first, *((t, why if v != "report" else v, n) for t, v, n in rest)]
    rest = later_claims(foundation_means({f: by_foundation[f] for f in passing}))
    return [first, *rest]


#: the rule of the foundation design, fixed before its runs (issue 62)
RANDOM_FACTOR = (
    "The foundation is a random factor: F foundations pre-trained by one recipe with different "
    "seeds (`raysim pretrain tiny-llama --seed k`, portable kernels), each run on the same "
    "training seeds. Per foundation, each method's figure is the mean over its seeds; the "
    "methods are then compared paired by foundation (the mean difference, its t-interval with "
    "F − 1 degrees of freedom, exact sign flips over the F foundations) under the rules above. "
    "The sanity gate is applied per foundation, on its seeds' mean: the claims are decided over "
    "the foundations that pass it, and are void where fewer than two do. This rule was written "
    "before the runs it decides."
)


#: what every claim after a failed sanity gate says (FedOA spec §7.1: "the results are void")
VOID = "void (gate not held)"


def void_after_gate(checks: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """FedOA spec §7.1's sanity gate comes "before any claim": where it is not held, every later
    claim's verdict is ``VOID`` (its numbers still shown), never held or not held."""
    gate = checks[0][1]
    if gate == HELD:
        return checks
    return [checks[0], *((text, VOID if v != "report" else v, n) for text, v, n in checks[1:])]


def non_decreasing(steps: list[Paired]) -> str:
    """Claim 2a as FedOA spec §7.1 words it: OOD ROUGE-1 "non-decreasing in λ from 0 to 2 (allow one
    inversion ≤ 1 point)". Each step's fall must stay under 1 point (its part: the step's change
    > −1 by the rules), and at most one step may fall at all (its mean change below 0): a second
    inversion refutes the claim whatever the intervals say."""
    if sum(s.mean < 0 for s in steps) > 1:
        return NOT_HELD
    return all_of([s.verdict for s in steps])


#: the claims tables' heading; a held-out family other than the config's adds ", F held out"
CLAIMS_HEADING = "## The spec's directional claims (§7.1)"
#: a verdict as the tables write it (the reports before issue 45 wrote yes / **no** / partly)
VERDICT_WORDS = {"yes": HELD, "**no**": NOT_HELD, HELD: HELD, NOT_HELD: NOT_HELD,
                 INCONCLUSIVE: INCONCLUSIVE, "partly": "partly",
                 "void": "void (gate not held)"}  # fmt: skip


def claims_section(previous: str, held_out: str | None) -> str:
    """The part of a RESULTS.md holding the claims table of one setting: the first heading of
    the claims with nothing held out but the config's (``held_out`` None), else the first heading
    that names ``"<held_out> held out"``; empty where there is none."""
    lines = previous.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            continue
        mine = (
            line.startswith(CLAIMS_HEADING[:30]) and "held out" not in line
            if held_out is None
            else f"{held_out} held out" in line
        )
        if mine:
            rest = lines[i + 1 :]
            end = next((j for j, x in enumerate(rest) if x.startswith("#")), len(rest))
            return "\n".join(rest[:end])
    return ""


def changed(checks: list[tuple[str, str, str]], previous: str) -> list[str]:
    """The verdicts that differ from the claims table in ``previous`` (the same setting's table
    of the report this one replaces, ``claims_section``), each with its claim."""
    old: dict[str, str] = {}
    for line in previous.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        verdict = cells[1].split(" (")[0] if len(cells) == 3 else ""
        if verdict in VERDICT_WORDS:
            key = cells[0].replace("**", "").split(".")[0].split(":")[0].strip()
            if key in old:
                break  # the next table
            old[key] = VERDICT_WORDS[verdict]
    out = []
    for text, verdict, _ in checks:
        key = text.split(".")[0].split(":")[0].strip()
        if key in old and old[key] != verdict and verdict != "report":
            out.append(f"- {key}: {old[key]} → {verdict}")
    return out


def foundation_used(overrides: list[str]) -> dict:
    """The frozen base the runs load (``model.path``, from the overrides or the config): its
    folder, weights digest, held-out exact match and the CPU that pre-trained it. The same code
    pre-trains a different foundation on another CPU (float kernels differ), so a report names
    its foundation, and ``--combine`` refuses seeds run on different ones."""
    from raysim.config import load_config
    from raysim.models.foundation import foundation_metadata, weights_digest

    path = load_config(CONFIG, overrides).model.path
    meta = foundation_metadata(path) or {}
    return {
        "path": path,
        "weights_sha256": meta.get("weights_sha256") or weights_digest(path),
        "heldout_exact_match": meta.get("heldout_exact_match"),
        "cpu": meta.get("machine", {}).get("cpu", "not recorded"),
        "cpu_capability": meta.get("machine", {}).get("cpu_capability", "not recorded"),
        "kernels": meta.get("machine", {}).get("kernels", "native"),
    }


def pretraining_recipe(path: str) -> dict:
    """How the foundation at ``path`` was pre-trained, from its ``raysim_foundation.json``: the
    report's "which model" (kept beside the runs; the identity is ``foundation_used``'s)."""
    from raysim.models.foundation import foundation_metadata

    meta = foundation_metadata(path) or {}
    config = meta.get("config", {})
    keep = ("steps", "batch_size", "lr", "init_seed", "data_seed", "corpus_size", "families")
    return {
        **{k: config[k] for k in keep if k in config},
        "shape": config.get("shape", {}),
        "parameters": meta.get("parameters"),
        "vocab_size": meta.get("vocab_size"),
        "pretrain_seconds": meta.get("pretrain_seconds"),
    }


def describe_foundation(base: dict) -> str:
    """One line naming the foundation ``foundation_used`` found."""
    match = base.get("heldout_exact_match")
    return (
        f"Foundation `{base['path']}`: weights sha256 `{base['weights_sha256'][:12]}`, "
        f"held-out exact match {'not recorded' if match is None else f'{match:.3f}'}, "
        "pre-trained on "
        f"{base['cpu']} ({base['cpu_capability']})."
    )


def report(
    rows: dict[str, list[dict]],
    checks: list,
    seeds: list[str],
    parent: str | None,
    wall: float,
    previous: str = "",
    held_out: str | None = None,
    foundation: dict | None = None,
) -> str:
    """The per-method table and, where ``checks`` are given, the claims table with its rules
    and the verdicts that changed from ``previous`` (the same setting's section);
    ``foundation``: which frozen base the runs used (``foundation_used``)."""
    cols = [
        ("ood_rouge1", "OOD R-1 (routed)"),
        ("ood_rouge1_global", "OOD R-1 (global)"),
        ("id_rouge1", "ID R-1"),
        ("ood_loss", "OOD loss"),
        ("fd_first", "feat. dist. first"),
        ("fd_last", "feat. dist. last"),
    ]
    lines = [
        f"Seeds {', '.join(seeds)}: mean ± sample standard deviation; MLflow parent run "
        f"`{parent}`; {wall / 60:.1f} min wall.",
        *([describe_foundation(foundation)] if foundation else []),
        "",
        "| method | " + " | ".join(c for _, c in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for m, seed_rows in rows.items():
        cells = []
        for k, _ in cols:
            values = [r[k] for r in seed_rows if k in r]
            summary = Summary.of(values, higher_is_better=k != "ood_loss") if values else None
            cells.append(summary.text(digits=2).split(" (")[0] if summary else "—")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    if not checks:
        return "\n".join(lines) + "\n"
    title = CLAIMS_HEADING + (f", {held_out} held out" if held_out else "")
    head = "| claim (FedOA spec §7.1) | verdict | measured: mean difference [95 % interval], p |"
    lines += ["", title, "", RULES, "", head, "|---|---|---|"]
    for text, verdict, numbers in checks:
        lines.append(f"| {text} | {verdict} | {numbers} |")
    if previous:
        lines += ["", "Verdicts that changed from the report this one replaces:", ""]
        lines += changed(checks, previous) or ["- none"]
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

    from raysim.tracking.store import default_tracking_uri

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
    if axes[-1].get_legend_handles_labels()[0]:  # none where no curve method ran
        axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def combine(dirs: list[str], out: Path) -> None:
    """Join the per-seed rows of several runs (``--seeds`` done separately) and report."""
    tables = [json.loads((Path(d) / "qualitative.json").read_text()) for d in dirs]
    metas = [json.loads((Path(d) / "meta.json").read_text()) for d in dirs]
    seeds = [s for m in metas for s in m["seeds"]]
    parents = [m["parent_run_id"] for m in metas]
    wall = sum(m["wall_s"] for m in metas)
    methods = list(tables[0])
    rows = {m: [r for t in tables for r in t[m]] for m in methods}
    held = {m.get("held_out") for m in metas}
    bases = {json.dumps(m.get("foundation"), sort_keys=True) for m in metas}
    if len(bases) > 1:
        raise SystemExit(
            f"--combine: these runs used different foundations ({', '.join(sorted(bases))}); "
            "seeds on different frozen bases are not one experiment"
        )
    foundation = metas[0].get("foundation")
    _write(rows, seeds, ", ".join(map(str, parents)), wall, out, methods, held.pop(), foundation)
    plot_curves(parents, out / "curves.png")


def _write(
    rows: dict,
    seeds: list[str],
    parent: str | None,
    wall: float,
    out: Path,
    methods: list[str],
    held_out: str | None = None,
    foundation: dict | None = None,
) -> None:
    """``qualitative.md`` (verdicts where every method ran on 2+ seeds) and ``qualitative.json``
    (every seed's row); ``held_out``: the family held out where an override names one."""
    decide = set(METHODS) <= set(methods) and len(seeds) > 1
    previous = claims_section((HERE / "RESULTS.md").read_text(), held_out) if decide else ""
    checks = claims(rows) if decide else []
    text = report(rows, checks, seeds, parent, wall, previous, held_out, foundation)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qualitative.md").write_text(text)
    (out / "qualitative.json").write_text(json.dumps(rows, indent=2))
    print(text)


def run_foundation(
    path: str, seeds: list[str], methods: dict, overrides: list[str], out: Path, progress
) -> None:
    """Every seed of every method on the foundation at ``path``, added to ``out/results.json``
    under the foundation's folder name (skipped where that entry has these seeds and weights)."""
    file = out / "results.json"
    results = json.loads(file.read_text()) if file.is_file() else {"foundations": {}}
    ov = [*overrides, f"model.path={path}", f"data.text.tokenizer={path}"]
    base = foundation_used(ov)
    name = Path(path).name
    done = results["foundations"].get(name)
    if done and done["seeds"] == seeds and done["foundation"] == base:
        print(f"{name}: done before, skipped")
        return
    started = time.perf_counter()
    res = leave_one_out(
        CONFIG, ov, key="seed", settings=seeds, methods=methods, name=f"fedoa-qualitative-{name}",
        on_run=lambda s, label, r: progress(f"{name}/{s}", label, r),
    )  # fmt: skip
    results["foundations"][name] = {
        "foundation": base,
        "pretraining": pretraining_recipe(path),
        "seeds": seeds,
        "rows": per_seed(res.results, seeds, list(methods)),
        "parent_run_id": res.parent_run_id,
        "wall_s": time.perf_counter() - started,
        "overrides": overrides,
    }
    file.write_text(json.dumps(results, indent=1))


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
        "--foundations",
        default=None,
        help="comma-separated foundation folders: every seed on each (the foundation as a random "
        "factor), kept in OUT/results.json foundation by foundation (a rerun skips those done); "
        "report.py decides the claims from it",
    )
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
    if args.foundations:
        for path in args.foundations.split(","):
            run_foundation(path, seeds, methods, overrides, out, progress)
        return
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
    rows = per_seed(res.results, seeds, list(methods))
    wall = time.perf_counter() - started
    held = [o.split("=", 1)[1] for o in overrides if o.startswith("data.text.held_out=")]
    base = foundation_used(overrides)
    _write(rows, seeds, res.parent_run_id, wall, out, list(methods), (held or [None])[-1], base)
    meta = {"seeds": seeds, "parent_run_id": res.parent_run_id, "wall_s": wall,
            "held_out": (held or [None])[-1], "foundation": base}  # fmt: skip
    (out / "meta.json").write_text(json.dumps(meta))
    if res.parent_run_id:
        plot_curves([res.parent_run_id], out / "curves.png")


if __name__ == "__main__":
    main()
