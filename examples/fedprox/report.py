"""FedProx's systems-heterogeneity claims decided from ``reproduce.py``'s ``results.json``: tables,
verdicts (``raysim.verdicts``) and the training-loss and test-accuracy curves.

    python examples/fedprox/report.py runs/fedprox/results.json --write examples/fedprox

writes RESULTS.md (its introduction too: what is done, how long it took) and curves.png from the
results alone, so the committed report is regenerated from the committed results byte for byte
(``tests/test_reports.py``).

Metrics, as the paper reports them (§5.1, "all metrics based on the global objective f(w)"):
the **training loss** is ``global_train_loss``, the loss of the global model over every device's
training rows, and the **test accuracy** ``accuracy``, over every device's held-out rows pooled.
A run's final value is the mean over its last 10 rounds (one round's value moves with the last
round's sample); its **instability** is the sum of the training loss's rises from round to round
(0 for a curve that only falls), the paper's "more stable convergence" made a number.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from raysim.verdicts import RULES, Paired, Summary, all_of

#: the seeds a claim is decided on (reproduce.py's); with fewer, its line shows the paired
#: differences so far and no verdict
SEEDS = 5

HERE = Path(__file__).parent
LAST = 10
METHODS = {"fedavg": "FedAvg (drops stragglers)", "fedprox_mu0": "FedProx, μ = 0",
           "fedprox_mu1": "FedProx, μ = 1"}  # fmt: skip
DATA = {"1_1": "Synthetic(1,1)", "iid": "Synthetic-IID", "0_0": "Synthetic(0,0)",
        "0.5_0.5": "Synthetic(0.5,0.5)"}  # fmt: skip


def curve(run: dict, metric: str) -> np.ndarray:
    return np.array([r.get(metric, np.nan) for r in run["rounds"]], dtype=np.float64)


def final(run: dict, metric: str) -> float:
    return float(np.nanmean(curve(run, metric)[-LAST:]))


def instability(run: dict) -> float:
    loss = curve(run, "global_train_loss")
    return float(np.nansum(np.clip(np.diff(loss), 0, None)))


class Grid:
    """The runs of each dataset's complete seeds: those every cell of that dataset has (a grid
    interrupted mid-seed leaves that seed out until its cells are done; a dataset whose five
    seeds are all in decides its claims while another is still running)."""

    def __init__(self, runs: dict) -> None:
        self.runs = runs
        cells: dict[str, set[int]] = {}
        for k in runs:
            cell, seed = k.rsplit("/seed", 1)
            cells.setdefault(cell, set()).add(int(seed))
        self.seeds_of: dict[str, list[int]] = {}
        for data in DATA:
            mine = [v for c, v in cells.items() if c.startswith(data + "/")]
            if mine:
                self.seeds_of[data] = sorted(set.intersection(*mine))

    def cell(self, data: str, s: float, method: str) -> list[dict] | None:
        seeds = self.seeds_of.get(data, [])
        got = [self.runs.get(f"{data}/s{s:g}/{method}/seed{seed}") for seed in seeds]
        return got if got and all(got) else None

    def values(self, data: str, s: float, method: str, fn) -> list[float] | None:
        cell = self.cell(data, s, method)
        return None if cell is None else [fn(r) for r in cell]


def tables(g: Grid, out: list[str]) -> None:
    for data, name in DATA.items():
        rows = []
        for s in (0.0, 0.5, 0.9):
            for m, label in METHODS.items():
                loss = g.values(data, s, m, lambda r: final(r, "global_train_loss"))
                if loss is None:
                    continue
                acc = g.values(data, s, m, lambda r: final(r, "accuracy"))
                unstable = g.values(data, s, m, instability)
                loss_cell = Summary.of(loss, higher_is_better=False).text(1, 3)
                acc_cell = Summary.of(acc, higher_is_better=True).text(100, 1)
                rise_cell = Summary.of(unstable, higher_is_better=False).text(1, 2)
                rows.append(f"| {s:.0%} | {label} | {loss_cell} | {acc_cell} | {rise_cell} |")
        if rows:
            out += [f"### {name}", "",
                    "| stragglers | method | training loss (last 10 rounds) | test accuracy, % | "
                    "instability (sum of the loss's rises) |", "|---|---|---|---|---|",
                    *rows, ""]  # fmt: skip


def paired(g: Grid, data: str, s: float, a: str, b: str, fn, margin: float = 0.0,
           greater: bool = True) -> Paired | None:  # fmt: skip
    x, y = g.values(data, s, a, fn), g.values(data, s, b, fn)
    if x is None or y is None or len(x) < 2:
        return None
    return Paired.of(x, y, margin, greater)


def claims(g: Grid, out: list[str]) -> None:
    loss = lambda r: final(r, "global_train_loss")  # noqa: E731
    acc = lambda r: final(r, "accuracy")  # noqa: E731
    rows: list[tuple[str, str, str]] = []

    def add(claim: str, data: str, parts: list[tuple[str, Paired | None, str]],
            close: float | None = None):  # fmt: skip
        if any(p is None for _, p, _ in parts):
            rows.append((claim, "not run", ""))
            return
        verdicts = [p.within(close) if close is not None else p.verdict for _, p, _ in parts]
        text = "; ".join(
            f"{w}: {p.within_text(close, *FMT[fmt]) if close is not None else p.text(*FMT[fmt])}"
            for w, p, fmt in parts
        )
        n = len(g.seeds_of.get(data, []))
        decided = all_of(verdicts) if n >= SEEDS else f"undecided: {n} of {SEEDS} seeds"
        rows.append((claim, decided, text))

    d = "1_1"
    add("C1: FedAvg's training loss worsens with more stragglers, Synthetic(1,1) (§5.2)", d,
        [("90 % − 50 %", paired_levels(g, d, 0.9, 0.5, "fedavg", loss), "loss"),
         ("50 % − 0 %", paired_levels(g, d, 0.5, 0.0, "fedavg", loss), "loss")])  # fmt: skip
    for d in ("1_1", "0_0", "0.5_0.5"):
        name = DATA[d]
        fig = ("(Figure {})" if d == "1_1" else EXTENSION).format
        add("C2: FedProx μ = 0 (partial work) ends below FedAvg's training loss at 50 % and "
            f"90 %, {name} {fig(1)}", d,
            [(f"{s:.0%}", paired(g, d, s, "fedprox_mu0", "fedavg", loss, greater=False), "loss")
             for s in (0.5, 0.9)])  # fmt: skip
        add(f"C3a: FedProx μ = 1 ends below μ = 0's training loss at 0, 50 and 90 %, {name} "
            f"{fig(1)}", d,
            [(f"{s:.0%}", paired(g, d, s, "fedprox_mu1", "fedprox_mu0", loss, greater=False),
              "loss") for s in (0.0, 0.5, 0.9)])  # fmt: skip
        add("C3b: FedProx μ = 1's training loss is more stable (smaller rises) than μ = 0's, "
            f"{name} {fig(1)}", d,
            [(f"{s:.0%}", paired(g, d, s, "fedprox_mu1", "fedprox_mu0", instability,
                                 greater=False), "rise") for s in (0.0, 0.5, 0.9)])  # fmt: skip
        add("C5: FedProx (μ = 1) reaches a higher test accuracy than FedAvg at 50 % and 90 %, "
            f"{name} {fig(7)}", d,
            [(f"{s:.0%}", paired(g, d, s, "fedprox_mu1", "fedavg", acc), "acc")
             for s in (0.5, 0.9)])  # fmt: skip
    add("C8: on Synthetic-IID FedAvg is robust to stragglers: FedProx μ = 0 within 2 points of "
        "its test accuracy at 50 % and 90 % (Figure 5)", "iid",
        [(f"{s:.0%}", paired(g, "iid", s, "fedprox_mu0", "fedavg", acc), "acc")
         for s in (0.5, 0.9)], close=0.02)  # fmt: skip
    out += ["## The claims", "", RULES, "",
            "| claim | verdict | paired difference, mean [95 % interval] |", "|---|---|---|",
            *(f"| {c} | **{v}** | {t} |" for c, v, t in rows), ""]  # fmt: skip
    c7 = paired(g, "1_1", 0.9, "fedprox_mu1", "fedavg", acc)
    if c7 is not None:
        out += [f"C7, the abstract's \"22 % absolute test accuracy on average\" at 90 % "
                f"stragglers, averages five datasets of which Synthetic(1,1) is one; here, on "
                f"Synthetic(1,1) alone, FedProx (μ = 1) − FedAvg = {c7.text(100, 1)} points.",
                ""]  # fmt: skip


FMT = {"loss": (1.0, 3), "rise": (1.0, 2), "acc": (100.0, 1)}
#: the figures show stragglers on Synthetic(1,1) and Synthetic-IID only: the same claims on the
#: other two data sets extend the paper, and their lines say so
EXTENSION = "(Figure {}'s claim on data it does not show: an extension)"


def paired_levels(g: Grid, data: str, hi: float, lo: float, method: str, fn) -> Paired | None:
    x, y = g.values(data, hi, method, fn), g.values(data, lo, method, fn)
    return None if x is None or y is None or len(x) < 2 else Paired.of(x, y)


def identical_at_zero(g: Grid, out: list[str]) -> None:
    """C4: with no stragglers FedProx μ = 0 is FedAvg: the same weights, seed by seed."""
    same = total = 0
    for data in DATA:
        for seed in g.seeds_of.get(data, []):
            a = g.runs.get(f"{data}/s0/fedavg/seed{seed}")
            b = g.runs.get(f"{data}/s0/fedprox_mu0/seed{seed}")
            if a and b and "same_as" not in b:  # a later seed reuses FedAvg's run
                total += 1
                same += a["digest"] == b["digest"]
    if total:
        out += [f"C4 (Figure 1's caption: μ = 0 without stragglers *is* FedAvg): {same} of {total} "
                "pairs of runs end on the same weights, bit for bit; the other seeds' μ = 0 "
                "cells reuse FedAvg's run (reproduce.py's SAME).", ""]  # fmt: skip


def plot(g: Grid, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [d for d in DATA if any(k.startswith(d + "/") for k in g.runs)]
    fig, axes = plt.subplots(2 * len(data), 3, figsize=(12, 3.2 * 2 * len(data)), squeeze=False)
    for i, d in enumerate(data):
        for j, s in enumerate((0.0, 0.5, 0.9)):
            for row, metric, label in ((2 * i, "global_train_loss", "training loss"),
                                       (2 * i + 1, "accuracy", "test accuracy")):  # fmt: skip
                ax = axes[row][j]
                for m, name in METHODS.items():
                    cell = g.cell(d, s, m)
                    if cell is None:
                        continue
                    c = np.nanmean([curve(r, metric) for r in cell], axis=0)
                    ax.plot(np.arange(1, len(c) + 1), c, label=name)
                ax.set_title(f"{DATA[d]}, {s:.0%} stragglers", fontsize=9)
                ax.set_ylabel(label, fontsize=8)
                ax.set_xlabel("round", fontsize=8)
                if metric == "global_train_loss":
                    ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


SETTING = """Setting (`systems.yaml`), as Li et al., *Federated Optimization in Heterogeneous
Networks* (MLSys 2020, <https://arxiv.org/abs/1812.06127>) state it in §5 and Appendix C: 30 devices
with lognormal(4, 2) + 50 samples each, 10 sampled a round uniformly without replacement,
multinomial logistic regression (60 → 10), plain SGD at 0.01, batch 10, E = 20 local epochs, 200
rounds, μ = 1 for FedProx(μ > 0); aggregation weighted by training samples; the training loss over
all devices' training rows and the test accuracy over their pooled test rows, every round. Where the
paper is ambiguous: each device's data is split 80/20 as the paper says (its code splits 90/10); a
straggler's epochs are drawn uniformly from 1..E−1 from raysim's schedule stream (the code's
`randint(1, E)`; the paper writes [1, E]; the code's draws are a side effect of a global reseed);
the paper shows stragglers on Synthetic(1,1) (Figure 1) and Synthetic-IID (Figure 5) only, so (0,0)
and (0.5,0.5) with stragglers extend it.

The runs were measured on the 2-vCPU CPU machine from the twenty-fourth session on (2026-11-29),
after batched training wrote its step out; the runs of the session before, made with the autograd
step, ended on the same losses to six digits but other digests, and were replaced.
"""
COMMANDS = """```bash
python examples/fedprox/reproduce.py --out runs/fedprox \\
    --resume-from examples/fedprox/results.json     # --data 1_1 iid 0_0 0.5_0.5: all four
python examples/fedprox/report.py runs/fedprox/results.json --write examples/fedprox
```"""


def intro(g: Grid) -> list[str]:
    """What the grid holds and what it cost, from the runs themselves."""
    runs = g.runs
    cells = len(DATA) * 3 * len(METHODS) * SEEDS
    ran = [v for v in runs.values() if "same_as" not in v]
    seeds = sorted({int(k.rsplit("seed", 1)[1]) for k in runs})
    datas = [DATA[d] for d in DATA if d in g.seeds_of]
    minutes = sorted(v["seconds"] / 60 for v in ran)
    done = len(runs) == cells
    head = "a reproduction" if done else "in progress"
    lines = [f"# FedProx's systems heterogeneity on raysim's devices: {head}", ""]
    status = (
        f"{len(runs)} of the grid's {cells} cells are done ({len(ran)} runs; the rest are "
        "FedProx μ = 0 without stragglers, which is FedAvg's run by construction), on "
        f"{' and '.join(datas)}, seeds {', '.join(map(str, seeds))}."
    )
    if done:
        lines.append(status)
    else:
        complete = "; ".join(
            f"{DATA[d]}: {len(s)} of {SEEDS} seeds complete ({', '.join(map(str, s)) or 'none'})"
            for d, s in g.seeds_of.items()
        )
        lines.append(
            f"**Not a reproduction yet: {status}** A claim is decided once its dataset has all "
            f"{SEEDS} seeds; until then its line shows the paired differences over the seeds "
            f"complete so far ({complete}; a partly run seed is left out)."
        )
    if minutes:
        lines[-1] += (
            f" A run of 200 rounds took {np.median(minutes):.0f} minutes (median; the middle "
            f"half {np.quantile(minutes, 0.25):.0f}–{np.quantile(minutes, 0.75):.0f}) on the "
            "2-vCPU machine, two runs at a time beside "
            "other work (FedProx's heavy-tailed device sizes: about 4,700 local steps a round), "
            "so the grid runs in pieces:"
        )
    machines: dict[str, int] = {}
    for v in ran:
        where = v.get("machine", "not recorded (the runs made before runs recorded it)")
        machines[where] = machines.get(where, 0) + 1
    lines += ["", "Machines: " + "; ".join(f"{m}: {n} runs" for m, n in sorted(machines.items()))
              + (". A CPU's kernels round floats their own way: a claim compares runs of one "
                 "machine." if len(machines) > 1 else ".")]  # fmt: skip
    return [*lines, "", COMMANDS, "", SETTING, "![training loss and test accuracy over rounds]"
            "(curves.png)", ""]  # fmt: skip


def markdown(g: Grid) -> str:
    out = intro(g)
    tables(g, out)
    identical_at_zero(g, out)
    claims(g, out)
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="?", default=HERE / "results.json")
    ap.add_argument("--write", type=Path, default=None, help="write RESULTS.md and curves.png here")
    args = ap.parse_args()
    g = Grid(json.loads(args.results.read_text())["runs"])
    text = markdown(g)
    if args.write:
        (args.write / "RESULTS.md").write_text(text)
        plot(g, args.write / "curves.png")
    print(text, end="")


if __name__ == "__main__":
    main()
