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

from qualitative import (
    RANDOM_FACTOR,
    VERDICT_WORDS,
    foundation_means,
    nested_claims,
)

from raysim.verdicts import RULES, Summary, changes_block

HERE = Path(__file__).parent
RESULTS = HERE / "results.json"
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


def foundations_table(results: dict) -> list[str]:
    lines = [
        "| foundation | weights sha256 | held-out exact match | kernels | pre-trained on | seeds |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in results["foundations"].items():
        base = f["foundation"]
        match = base.get("heldout_exact_match")
        lines.append(
            f"| {name} | `{base['weights_sha256'][:12]}` | "
            f"{'—' if match is None else f'{match:.3f}'} | {base.get('kernels', 'native')} "
            f"({base['cpu_capability']}) | {base['cpu']} | {', '.join(f['seeds'])} |"
        )
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
    wall = sum(f["wall_s"] for f in results["foundations"].values())
    cpus = sorted({f["foundation"]["cpu"] for f in results["foundations"].values()})
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
    lines = [
        "# FedOA qualitative mini reproduction (FedOA spec §7.1, tier T2)",
        DESIGN,
        "## Foundations",
        "",
        *foundations_table(results),
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
        "## Where it ran",
        "",
        f"{'; '.join(cpus)}; {wall / 60:.0f} min of wall time in all, CPU only.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--write", type=Path, default=HERE, help="where RESULTS.md goes")
    args = ap.parse_args()
    old = args.write / "RESULTS.md"
    text = markdown(json.loads(args.results.read_text()), old.read_text() if old.is_file() else "")
    (args.write / "RESULTS.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
