"""FedOT's offline reproduction (FedOT spec §9), through raysim's own sweeps.

The grid of §9.2: {affine, colour} × {τ = 1, τ = 5 with rounds/5} × methods × 5 seeds on
sklearn's digits (n = 50 clients, m = 30, the other 297 images as every client's test pool seen
through its own shift). Methods: FedOT (λ > 0), the FedOT λ = 0 ablation, FedAvg, L-FedAvg (100
fine-tuning steps, and the paper's 500), FedMI (output space, α = 0.5), Fed-FOMAML (α = β = 0.05,
one adaptation step) and Local-only; baselines with the same MLP, lr 0.05, B = 20 and rounds.
Each cell is a Ray Tune sweep over the seeds (``raysim.tune``: an MLflow parent run per cell and
a child run per seed).

Then §9.4's extension (``fm-mini.yaml``): FedOT (as §9.4 writes it, and with its potentials
reading the embeddings in units of the table's std), its λ = 0 ablation, FedAvg and Local-only
with LoRA on a frozen LLaMA built from a config, under per-client embedding shifts, 5 seeds
(``fm/*``).

Results go to ``--results`` (``examples/fedot/results.json``, committed) after each cell: the
Tune table of every run plus, read back from MLflow, what the report needs of its history (the
largest zero-sum residual, the last map deviation and dual term, the accuracy curve). A cell
already there is not run again, so an interrupted reproduction resumes where it stopped, from a
fresh clone too. The MLflow store and Tune's files stay under ``--out``. ``report.py`` turns
the results into ``RESULTS.md``.

    python examples/fedot/reproduce.py --out runs/fedot-mini            # the grid
    python examples/fedot/reproduce.py --out /tmp/q --results /tmp/q/r.json --quick   # smoke
    python examples/fedot/reproduce.py --out runs/fedot-mini --only affine/1
    python examples/fedot/reproduce.py --out runs/fedot-mini --only affine/1/fedot --again
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
SHIFTS = {"affine": HERE / "mini.yaml", "colour": HERE / "colour.yaml"}
#: §9.4's extension: maps on a LoRA LLaMA's token embeddings under per-client embedding shifts
FM = HERE / "fm-mini.yaml"
FM_METHODS: dict[str, dict[str, Any] | None] = {
    "fedot": None,
    "fedot_std": {"potential_input": "embedding_std"},  # an extension of §9.4; see params
    "fedot_l0": {"lambda": 0.0},
    "fedavg": {"name": "fedavg"},
    "local_only": {"name": "local_only"},
}
TAUS = (1, 5)
#: five: with three the smallest one-sided sign-flip p-value is 1/8, and no comparison can be
#: decided (issue 62); a cell run on fewer seeds runs the missing ones and keeps the others
SEEDS = [0, 1, 2, 3, 4]
#: method label → the algorithm section (None: the example's own FedOT settings)
METHODS: dict[str, dict[str, Any] | None] = {
    "fedot": None,
    "fedot_l0": {"lambda": 0.0},
    "fedavg": {"name": "fedavg"},
    "l_fedavg": {"name": "l_fedavg", "finetune_steps": 100},
    "l_fedavg500": {"name": "l_fedavg", "finetune_steps": 500},
    "fedmi": {"name": "fedmi", "alpha": 0.5, "space": "output"},
    "fed_fomaml": {"name": "fed_fomaml", "alpha": 0.05, "beta": 0.05, "eval_steps": 1},
    "local_only": {"name": "local_only"},
}
#: methods whose evaluation adapts every client first: scored at the end only
FINAL_ONLY = {"l_fedavg500"}


RESULTS = HERE / "results.json"


def machine() -> str:
    """Where a cell ran, kept with its results (the report may be written elsewhere)."""
    import os
    import platform

    from raysim.util.machine import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run_digest(client: Any, run_id: str) -> dict[str, Any]:
    """What the report needs of one run's MLflow history (FedOT spec §3.3, §8.1 metrics)."""

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(run_id, key)}

    def last(key: str) -> float | None:
        h = history(key)
        return h[max(h)] if h else None

    ratios = list(history("dual_sum_ratio").values())  # from every client's stored head
    return {
        "zero_sum_residual": max(ratios) if ratios else None,
        "zero_sum_source": "stored_heads",
        "client_map_deviation": last("client_map_deviation"),
        "client_dual_penalty": last("client_dual_penalty"),
        "accuracy_curve": sorted(history("accuracy").items()),
    }


def diverged(storage: Path, since: float = 0.0) -> list[str]:
    """Each failed trial's ``Diverged`` line (the run's own words: round, client, which guard),
    from Tune's ``error.txt`` files under ``storage`` written at or after ``since`` (one
    attempt's, where an earlier attempt left its own there)."""
    lines = []
    for error in sorted(storage.rglob("error.txt")):
        if error.stat().st_mtime < since:
            continue
        said = [x for x in error.read_text().splitlines() if "Diverged:" in x]
        if said:
            lines.append(said[-1].split("Diverged:", 1)[1].strip())
    return lines


#: labelled extra cells beside the §9.2 grid: the colour cell at τ = 5, which collapses under
#: sync centring, under the two remedies its diagnosis found (issue 45): exact centring, and
#: ρ_U = 0.1 (λ² < 4ρ_vρ_U, a concave local max problem)
EXTRAS: dict[str, dict[str, Any]] = {
    "fedot_exact": {"dual_centering": "exact"},
    "fedot_rho_u0.1": {"rho_u": 0.1},
}
EXTRA_CELLS = ("colour", 5)


class Reproduction:
    def __init__(
        self, out: Path, quick: bool, results: Path = RESULTS, execution: str = "batched"
    ) -> None:
        self.out, self.quick, self.execution = out, quick, execution
        out.mkdir(parents=True, exist_ok=True)
        self.file = results
        self.results: dict[str, Any] = (
            json.loads(self.file.read_text()) if self.file.is_file() else {}
        )
        self.seeds = SEEDS[:1] if quick else SEEDS
        self.uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"

    def save(self) -> None:
        """Write the cells, keeping those another reproduction wrote meanwhile (``--only``
        runs side by side share the file)."""
        on_disk = json.loads(self.file.read_text()) if self.file.is_file() else {}
        self.results = {**on_disk, **self.results}
        self.file.write_text(json.dumps(self.results, indent=1, default=str))

    def config(self, shift: str, tau: int, method: str) -> dict[str, Any]:
        if shift == "fm":
            raw = yaml.safe_load(FM.read_text())
            rounds = raw["rounds"] // (10 if self.quick else 1)
            algo = FM_METHODS[method]
        else:
            raw = yaml.safe_load(SHIFTS[shift].read_text())
            rounds = raw["rounds"] // tau // (20 if self.quick else 1)
            raw["local"]["max_steps"] = tau
            algo = {**METHODS, **EXTRAS}[method]
        raw["rounds"] = rounds
        if algo is not None and "name" in algo:
            raw["algorithm"] = dict(algo)
        elif algo is not None:
            raw["algorithm"] = {**raw["algorithm"], **algo}
        raw["eval"] = {"every": rounds if method in FINAL_ONLY else max(rounds // 10, 1)}
        # one worker per trial, trials side by side; batched: a round's clients in one group
        raw["workers"] = {
            "count": 1,
            "num_cpus": 0.5,
            "execution": self.execution,
            "group_size": 64,
        }
        raw["tracking"] = {"experiment": "fedot-mini-reproduction", "uri": self.uri}
        raw["name"] = f"fedot-mini-{shift}-tau{tau}-{method}"
        return raw

    def cell(self, shift: str, tau: int, method: str) -> dict[str, Any]:
        """One cell's runs over ``self.seeds``: those it lacks are run (on this machine) and
        added; a cell every one of whose runs diverged is not run again."""
        label = f"fm/{method}" if shift == "fm" else f"{shift}/{tau}/{method}"
        done = self.results.get(label)
        ran = {int(r["seed"]) for r in (done or {}).get("table", []) if "seed" in r}
        if done and not done.get("table"):  # every run diverged: the seeds it tried
            ran = set(done.get("seeds", [0, 1, 2]))
        missing = [s for s in self.seeds if s not in ran]
        if done and not missing:
            return done
        if done and done.get("machine") != machine():
            raise SystemExit(
                f"{label}: its runs were made on {done.get('machine')}, this is {machine()}: "
                "seeds from two machines are not one cell (--elsewhere reruns it here)"
            )
        from raysim import tune

        raw = copy.deepcopy(self.config(shift, tau, method))
        raw["tune"] = {
            "metric": "accuracy",
            "mode": "max",
            "search": "grid",
            "space": {"seed": {"grid": missing}},
        }
        if done:  # another MLflow parent run for the added seeds
            raw["name"] = f"{raw['name']}-seeds-{'-'.join(map(str, missing))}"
        t0 = time.time()
        try:
            summary = tune(raw, storage=(self.out / "tune" / label).resolve())
        except RuntimeError as e:  # every trial failed (a diverged run stops with Diverged)
            if done and done.get("table"):
                raise SystemExit(f"{label}: the added seeds {missing} all failed ({e})") from e
            earlier = done or {}  # a cell whose every run diverged before: these are added
            self.results[label] = {
                "error": str(e),
                "diverged": [
                    *earlier.get("diverged", []),
                    *diverged((self.out / "tune" / label).resolve(), since=t0),
                ],
                "table": [],
                "seeds": sorted(ran | set(missing)),
                "seconds": earlier.get("seconds", 0.0) + time.time() - t0,
                "rounds": raw["rounds"],
                "execution": self.execution,
                "machine": machine(),
            }
            self.save()
            print(f"{label}: no run finished ({e})", flush=True)
            return self.results[label]
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self.uri)
        table = [
            {**row, **run_digest(client, row["run_id"])} if row.get("run_id") else row
            for row in summary.table
        ]
        if done:
            table = [*done["table"], *table]
            parent = f"{done['parent_run_id']}, {summary.parent_run_id}"
            seconds = done["seconds"] + time.time() - t0
        else:
            parent, seconds = summary.parent_run_id, time.time() - t0
        self.results[label] = {
            "parent_run_id": parent,
            "table": sorted(table, key=lambda r: r.get("seed", 0)),
            "seconds": seconds,
            "rounds": raw["rounds"],
            "execution": self.execution,
            "machine": machine(),
        }
        self.save()
        print(f"{label}: {len(summary.table)} runs in {time.time() - t0:.0f} s", flush=True)
        return self.results[label]

    def grid(self, only: str | None) -> None:
        for shift in SHIFTS:
            for tau in TAUS:
                for method in METHODS:
                    label = f"{shift}/{tau}/{method}"
                    if only is None or label.startswith(only):
                        self.cell(shift, tau, method)
        for method in FM_METHODS:
            if only is None or f"fm/{method}".startswith(only):
                self.cell("fm", 0, method)
        shift, tau = EXTRA_CELLS
        for method in EXTRAS:
            if only is None or f"{shift}/{tau}/{method}".startswith(only):
                self.cell(shift, tau, method)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="MLflow store and Tune files")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the cells' results (JSON)")
    ap.add_argument(
        "--execution",
        choices=["batched", "sequential"],
        default="batched",
        help="workers.execution of every run (the two agree to float rounding per round)",
    )
    ap.add_argument("--quick", action="store_true", help="1 seed, rounds/20 (a smoke test)")
    ap.add_argument("--only", default=None, help="cells whose label starts with this")
    ap.add_argument(
        "--again",
        action="store_true",
        help="run the --only cells again, replacing what --results holds for them (e.g. after "
        "a change to what a run logs)",
    )
    ap.add_argument(
        "--elsewhere",
        action="store_true",
        help="run again, here, every cell whose runs were made on another machine (a comparison "
        "across machines decides nothing: report.py)",
    )
    args = ap.parse_args()
    if args.again and not args.only:
        ap.error("--again replaces the --only cells: name them (--only affine/1/fedot)")
    repro = Reproduction(args.out, args.quick, args.results, args.execution)
    if args.again:
        # the named cell, or the cells under a named prefix (affine/1/fedot is not fedot_l0)
        prefix = args.only.rstrip("/")
        again = [k for k in repro.results if k == prefix or k.startswith(prefix + "/")]
        repro.results = {k: v for k, v in repro.results.items() if k not in again}
        repro.file.write_text(json.dumps(repro.results, indent=1, default=str))
    if args.elsewhere:
        here = machine()
        other = [k for k, v in repro.results.items() if v.get("machine") != here]
        repro.results = {k: v for k, v in repro.results.items() if k not in other}
        repro.file.write_text(json.dumps(repro.results, indent=1, default=str))
        print(f"{len(other)} cells made on other machines will run here ({here})")
    repro.grid(args.only)


if __name__ == "__main__":
    main()
