"""FedOA's RESULTS.md from ``qualitative.py --foundations``' raw results, the foundation a random
factor (issue 62): the foundations, each method's figures over them, the claims of FedOA spec §7.1
decided over foundations, and the verdicts that changed.

    for k in 0 1 2 3 4; do raysim pretrain tiny-llama --seed $k --out foundations/tiny-f$k; done
    python examples/fedoa/qualitative.py --seeds 0,1 --out runs/fedoa \\
        --foundations foundations/tiny-f0,foundations/tiny-f1,foundations/tiny-f2,...
    cp runs/fedoa/results.json examples/fedoa/results.json
    python examples/fedoa/report.py          # examples/fedoa/results.json -> RESULTS.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from qualitative import (
    CONFIG,
    GATE_MARGIN,
    METHODS,
    RANDOM_FACTOR,
    VERDICT_WORDS,
    foundation_means,
    gate_gaps,
    means,
    nested_claims,
    plot_curves,
)

from raysim.verdicts import RULES, Summary, changes_block

HERE = Path(__file__).parent
RESULTS = HERE / "results.json"
#: per-round curves over every foundation's runs (``--curves``: from the MLflow store, which is
#: not committed; results.json keeps each run's final figures only)
CURVES_PNG = "results-curves.png"
COLUMNS = {
    "ood_rouge1": ("OOD R-1 (routed)", True),
    "ood_rouge1_global": ("OOD R-1 (global)", True),
    "id_rouge1": ("ID R-1", True),
    "ood_loss": ("OOD loss", False),
    "fd_last": ("feat. dist. last", False),
}
DESIGN = """
Every number below was measured by `examples/fedoa/qualitative.py --foundations` and written by
`examples/fedoa/report.py` from `examples/fedoa/results.json`; nothing is copied from the paper.
The setting is §7.1's tier T2 as `examples/fedoa/qualitative.yaml` gives it: the spec's held-out
family (reading comprehension), LoRA r = 8 on q/v, 6 clients, 8 rounds.

Two choices of earlier reports are not repeated here. Entailment was held out after a seed-0
screen showed the gate passing there, and its seed 0 was reused in the confirmation: a family
chosen on the data it is then judged on. And the spec's remedy for a failed gate (LoRA on all
linear modules, more pre-training) changes the toy after seeing its result; here the spec's
setting runs as written and a foundation that fails the gate voids its claims. The remedy is a
setting of its own (`model.lora.targets` over every linear module), to be reported as such.
"""


ROUTING = """
Methods: FedOA with λ ∈ {0, 0.1, 0.5, 2} and D ∈ {L2, cosine, Pearson} at λ = 0.5, and as
baselines FedIT, Centralized, Local-only, FedLoRA, PERADA, pFedMe (K_in = 2, as §7.1 allows),
FedSDR, Ditto and the frozen base (`zero_shot`: FedIT with no local epoch). Scoring follows §4.6:
**OOD R-1 (routed)** scores each personalised method with each client's personal adapter,
averaged over clients (FedIT, Centralized and zero-shot use the global adapter); **OOD R-1
(global)** is the global adapter, which every method but pFedMe trains as FedIT does, apart
from its personal adapters (the same figures as FedIT's, run for run); **ID R-1** is each client
on its own sub-dataset's test split. Local-only is FedOA at λ = 0, so their rows agree.
"""


def foundations_table(results: dict) -> list[str]:
    lines = [
        "| foundation | pre-training seed | weights sha256 | held-out exact match | kernels "
        "| pre-trained on | training seeds | MLflow parent run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, f in results["foundations"].items():
        base = f["foundation"]
        match = base.get("heldout_exact_match")
        lines.append(
            f"| {name} | {f['pretraining']['init_seed']} | `{base['weights_sha256'][:12]}` | "
            f"{'—' if match is None else f'{match:.3f}'} | {base.get('kernels', 'native')} "
            f"({base['cpu_capability']}) | {base['cpu']} | {', '.join(f['seeds'])} | "
            f"`{f['parent_run_id'][:12]}` |"
        )
    return lines


def setup_table(cfg: dict, results: dict) -> list[str]:
    """The setting, from ``qualitative.yaml`` (``cfg``) and the foundations' recorded recipe."""
    text, local, lora = cfg["data"]["text"], cfg["local"], cfg["model"]["lora"]
    recipes = [f["pretraining"] for f in results["foundations"].values()]
    r, shape = recipes[0], recipes[0]["shape"]
    minutes = [x["pretrain_seconds"] / 60 for x in recipes]
    rows = [
        ("model", f"a LLaMA of hidden {shape['hidden_size']}, "
                  f"{shape['num_hidden_layers']} layers, {shape['num_attention_heads']} "
                  f"heads: {r['parameters']:,} parameters, a word-level tokenizer of "
                  f"{r['vocab_size']} words"),
        ("pre-training", f"full-parameter, {r['steps']:,} AdamW steps of batch "
                         f"{r['batch_size']}, lr {r['lr']}, on a generic instruction "
                         f"corpus of {r['corpus_size']:,} examples "
                         f"({', '.join(r['families'])}; none of Flan-mini's tasks), "
                         f"then frozen; {min(minutes):.0f}–{max(minutes):.0f} min of wall "
                         "time each on the machine below"),
        ("data", f"Flan-mini, {text['n_train']} train / {text['n_test']} test per "
                 f"sub-dataset, data seed {text['data_seed']}"),
        ("clients", f"{cfg['clients']['num']}, {cfg['clients']['per_round']} a round"),
        ("held-out family", f"{text['held_out'].replace('_', ' ')} (the out-of-distribution set)"),
        ("schedule", f"T = {cfg['rounds']} rounds, K = {local['epochs']} local epochs, "
                     f"B = {local['batch_size']}"),
        ("local optimiser", f"{local['optimizer']}, lr {local['lr']}, {local['lr_schedule']} "
                            f"decay per call, clip {local['max_grad_norm']}"),
        ("LoRA", f"r = {lora['r']}, α = {lora['alpha']}, dropout {lora['dropout']}, on "
                 f"{'/'.join(x.removesuffix('_proj') for x in lora['targets'])}"),
        ("evaluation", f"greedy decoding, at most {cfg['eval']['max_new_tokens']} new tokens, "
                       "ROUGE-1 via `rouge-score`"),
    ]  # fmt: skip
    return ["| setting | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def per_foundation_table(results: dict, gaps: dict[str, float]) -> list[str]:
    """Each foundation's mean over its seeds: the gate's two terms and claim 1's differences."""
    lines = [
        "| foundation | zero-shot OOD | FedIT OOD | FedIT − zero-shot (gate: > +5) "
        "| FedOA(0.5) − Local-only (1a) | FedOA(0.5) − FedLoRA (1b) |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in results["foundations"].items():
        t = {m: v["ood_rouge1"] for m, v in means(f["rows"]).items()}
        gap = gaps[name]
        lines.append(
            f"| {name} | {t['zero_shot']:.2f} | {t['fedit']:.2f} | {gap:+.2f}"
            f"{'' if gap > GATE_MARGIN else ' (fails)'} | "
            f"{t['fedoa_l0.5'] - t['local_only']:+.2f} | {t['fedoa_l0.5'] - t['fedlora']:+.2f} |"
        )
    return lines


def verdict_first(checks: list[tuple[str, str, str]], gaps: dict[str, float]) -> list[str]:
    """The headline, from the claims as decided and the gate's measure per foundation."""
    gate, later = checks[0], [c for c in checks[1:] if c[1] != "report"]
    n = len(gaps)
    void = [c for c in later if c[1].startswith("void")]
    by_key = {c[0].split(".")[0]: c for c in later}
    passing = sum(g > GATE_MARGIN for g in gaps.values())
    held = "held on every foundation" if gate[1] == "held" else f"{gate[1]} foundations"
    lines = [f"- **The sanity gate** (FedIT − frozen base > +{GATE_MARGIN:g} on the held-out "
             f"family, per foundation): {held}. {gate[2]}."]  # fmt: skip
    if len(void) == len(later):
        lines.append(
            f"- **So every later claim is void** ({len(void)} of {len(later)}), as FedOA spec "
            "§7.1 says of results after a failed gate and as the rule below, written before the "
            f"runs, decides. On {n - passing} of {n} foundations of one recipe, federated "
            "instruction tuning on the training families does not carry over to the held-out "
            "family by the margin the spec asks of a setting before it can test FedOA's claims."
        )
        measured = [by_key[k] for k in ("1a", "1b") if k in by_key]
        lines += [f"- Measured, not decided: {c[0]}: {c[2]}." for c in measured]
    else:
        counts: dict[str, int] = {}
        for c in later:
            counts[c[1]] = counts.get(c[1], 0) + 1
        lines.append("- Later claims: " + ", ".join(f"{v} {k}" for k, v in counts.items()) + ".")
    return lines


def methods_table(results: dict) -> list[str]:
    by = {name: f["rows"] for name, f in results["foundations"].items()}
    rows = foundation_means(by)
    head = " | ".join(label for label, _ in COLUMNS.values())
    lines = [f"| method | {head} |", "|---" * (len(COLUMNS) + 1) + "|"]
    for m, per_foundation in rows.items():
        cells = []
        for key, (_, higher) in COLUMNS.items():
            values = [r[key] for r in per_foundation if key in r]
            s = Summary.of(values, higher_is_better=higher) if values else None
            cells.append(s.text(digits=2).split(" (")[0] if s else "—")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def previous_verdicts(text: str) -> dict[str, str]:
    """The first claims table of ``text``: claim key -> verdict."""
    old: dict[str, str] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        verdict = cells[1].split(" (")[0] if len(cells) == 3 else ""
        if verdict in VERDICT_WORDS or verdict.startswith("held on"):
            key = cells[0].replace("**", "").split(".")[0].split(":")[0].strip()
            if key in old:
                break
            old[key] = VERDICT_WORDS.get(verdict, verdict)
    return old


def _kind(verdict: str) -> str:
    """A verdict's kind: every void verdict is one, whichever gate voided it."""
    return "void" if verdict.startswith("void") else verdict


def markdown(results: dict, previous: str = "") -> str:
    by = {name: f["rows"] for name, f in results["foundations"].items()}
    checks = nested_claims(by)
    gaps = gate_gaps(by)
    foundations = results["foundations"].values()
    wall = sum(f["wall_s"] for f in foundations)
    cpus = sorted({f["foundation"]["cpu"] for f in foundations})
    current = {t.split(".")[0].split(":")[0].strip(): v for t, v, _ in checks if v != "report"}
    old = previous_verdicts(previous)
    moved = [k for k, v in current.items() if k in old and _kind(old[k]) != _kind(v)]
    changed = [f"- {k}: {old[k]} → {current[k]}" for k in moved]
    fresh = [
        "Verdicts that changed from the report this one replaces (one foundation's seeds "
        "treated as independent replicates, a held-out family chosen after a screen), and why: "
        "the claims are now decided over foundations, the gate per foundation, and a claim "
        "after a failed gate is void (issue 62):",
        "",
        *(changed or ["- none (a claim void before is void again; its row says why)"]),
    ]
    cfg = yaml.safe_load(CONFIG.read_text())
    seeds = next(iter(foundations))["seeds"]
    runs = sum(len(rows) for f in foundations for rows in f["rows"].values())
    lines = [
        "# FedOA qualitative mini reproduction (FedOA spec §7.1, tier T2)",
        "",
        "## Verdict first",
        "",
        *verdict_first(checks, gaps),
        DESIGN,
        "## Setup",
        "",
        *setup_table(cfg, results),
        ROUTING,
        "## Foundations",
        "",
        *foundations_table(results),
        "",
        "## Per foundation (the mean of its seeds, OOD ROUGE-1 routed)",
        "",
        *per_foundation_table(results, gaps),
        "",
        f"![Per-round curves, mean over {len(by)} foundations × their seeds]({CURVES_PNG})",
        "",
        "Per-round curves: the mean over every foundation's runs, drawn by `report.py --curves` "
        "from the MLflow store that ran them.",
        "",
        f"## Each method over {len(by)} foundations (mean ± sample std of the foundations' means)",
        "",
        *methods_table(results),
        "",
        "## The spec's directional claims (§7.1), over foundations",
        "",
        RULES,
        "",
        RANDOM_FACTOR,
        "",
        "| claim (FedOA spec §7.1) | verdict | measured: mean difference [95 % interval], p |",
        "|---|---|---|",
        *(f"| {t} | {v} | {n} |" for t, v, n in checks),
        "",
        *changes_block(previous, old, current, fresh),
        "",
        "## Reproduce",
        "",
        "```bash",
        *(f"raysim pretrain tiny-llama --seed {f['pretraining']['init_seed']} "
          f"--out {f['foundation']['path']}" for f in foundations),
        f"python examples/fedoa/qualitative.py --seeds {','.join(seeds)} --out runs/fedoa \\",
        "    --foundations " + ",".join(f["foundation"]["path"] for f in foundations),
        "cp runs/fedoa/results.json examples/fedoa/results.json",
        "python examples/fedoa/report.py",
        "```",
        "",
        f"Each foundation's runs are an MLflow parent run (the table above) in the experiment "
        f"`{cfg['tracking']['experiment']}` of the store that ran them (`raysim ui`); the store "
        "is not committed, "
        f"`examples/fedoa/results.json` keeps every run's figures: {runs} runs ({len(METHODS)} "
        f"methods × {len(seeds)} seeds × {len(results['foundations'])} foundations).",
        "",
        "## Where it ran",
        "",
        f"{'; '.join(cpus)}; {wall / 60:.0f} min of wall time in all, CPU only.",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--write", type=Path, default=HERE, help="where RESULTS.md goes")
    ap.add_argument(
        "--curves",
        action="store_true",
        help=f"also draw {CURVES_PNG} from the MLflow store that ran the foundations' parent runs",
    )
    args = ap.parse_args()
    results = json.loads(args.results.read_text())
    if args.curves:
        from mlflow.exceptions import MlflowException

        parents = [f["parent_run_id"] for f in results["foundations"].values()]
        try:
            plot_curves(parents, args.write / CURVES_PNG)
        except MlflowException as e:  # a parent run this store does not hold
            raise SystemExit(
                f"--curves: {e}; run it where qualitative.py ran (its MLflow store), or without "
                "--curves"
            ) from e
    old = args.write / "RESULTS.md"
    text = markdown(results, old.read_text() if old.is_file() else "")
    (args.write / "RESULTS.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
