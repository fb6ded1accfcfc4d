"""FedBaF's offline mini reproduction (FedBaF spec §8.1), through raysim's own commands.

Stages:

1. the foundations (``raysim pretrain``): the 20-class flipped-digit MLP (600 pool samples, 20
   epochs) and chain A's Transformer LM; plus the foundation-quality grid of §8.1
   (100 / 300 / 600 samples × 2 / 20 epochs);
2. the vision grid, each cell a Ray Tune sweep over 5 seeds (``raysim.tune``, one MLflow parent
   run per cell, a child run per seed): {no-foundation (ψ = 0), weight-init, FedBaF} × {FedAvg,
   FedProx μ = 0.01, FedAdam η_g = 0.01} × {IID, non-IID} without attack, and the attacks
   (ζ, λ) ∈ {(0.1, 1), (0.2, 1), (0.5, 1), (0.5, 5)} over FedAvg;
3. ψ = 0 against plain FedAvg, seed by seed (claim 6), and the foundation-quality cells;
4. the LM proxy: the three methods × {no attack, (ζ, λ) = (0.5, 5)} × 5 seeds;
5. security: the leak auditor on FedBaF and on weight-init (claim 7), and the extraction harness
   (``raysim extract``) on runs whose every client observes (full collusion) and half of them do.

Results (sweep tables, MLflow run ids, extraction summaries) go to ``OUT/results.json`` after each
step; a step already there is not run again, so an interrupted reproduction resumes where it
stopped. ``report.py`` turns them into ``RESULTS.md`` and plots.

    python examples/fedbaf/reproduce.py --out runs/fedbaf-mini          # ~1.7 h on 2 CPUs
    python examples/fedbaf/reproduce.py --out /tmp/q --quick            # 2 seeds, 20 rounds
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from grid import machine, metric_histories  # noqa: E402  (examples/grid.py, shared by the examples)

VISION, LM = HERE / "mini.yaml", HERE / "mini-lm.yaml"
SEEDS = [0, 1, 2, 3, 4]  # issue 45: five seeds where a cell costs under a minute
BASES: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "fedprox": {"mu": 0.01},
    "fedadam": {"server_lr": 0.01, "beta1": 0.9, "beta2": 0.99},
}
METHODS = {"none": {"psi": 0.0}, "weight_init": {"variant": "weight_init"}, "fedbaf": {}}
PARTITIONS: dict[str, dict[str, Any]] = {
    "iid": {},
    "noniid": {
        "data.partition.kind": "class_subset",
        "local.absent_logits": "zero",
        "eval.local_accuracy": True,
    },
}
ATTACKS = {
    "z0": (0.0, 1.0),
    "z0.1": (0.1, 1.0),
    "z0.2": (0.2, 1.0),
    "z0.5": (0.5, 1.0),
    "z0.5l5": (0.5, 5.0),
}
QUALITY = [(100, 2), (100, 20), (300, 2), (300, 20), (600, 2), (600, 20)]


def attack_hooks(zeta: float, lam: float, rule: str) -> list[dict[str, Any]]:
    if zeta == 0:
        return []
    return [{"name": "label_shuffle", "fraction": zeta, "epoch_scale": lam, "epoch_rule": rule}]


def set_key(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    node = raw
    for key in path:
        node = node.setdefault(key, {})
    node[last] = value


#: the series report.py reads, stored with each run in results.json (as Feddle's are), so the
#: report is written from that file alone, without the MLflow store
HISTORY_KEYS = (
    "accuracy",
    "client_local_accuracy",
    "fedbaf_c",
    "fedbaf_r",
    "fedbaf_pre_cosine",
    "fedbaf_pre_distance",
)


def store_series(results: dict[str, Any], uri: str) -> None:
    """Every run's ``HISTORY_KEYS`` from the MLflow store at ``uri`` into ``results``' rows."""
    for v in results.values():
        for row in v.get("table", []) if isinstance(v, dict) else []:
            if isinstance(row, dict) and row.get("run_id"):
                row["history"] = metric_histories(uri, row["run_id"], HISTORY_KEYS)


class Reproduction:
    def __init__(self, out: Path, quick: bool) -> None:
        self.out, self.quick = out, quick
        self.file = out / "results.json"
        self.results: dict[str, Any] = (
            json.loads(self.file.read_text()) if self.file.is_file() else {}
        )
        self.seeds = SEEDS[:2] if quick else SEEDS  # two: the fewest a paired verdict takes
        self.uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
        self.foundations = out / "foundations"

    def save(self) -> None:
        self.file.write_text(json.dumps(self.results, indent=1, default=str))

    def raysim(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "raysim.cli", *args], check=True)

    # ----------------------------------------------------------------- stage 1
    def pretrain(self) -> None:
        for samples, epochs in QUALITY:
            path = self.foundations / f"digits-{samples}-e{epochs}"
            if not (path / "model.safetensors").is_file():
                self.raysim(
                    "pretrain",
                    "digits",
                    "--out",
                    str(path),
                    "--samples",
                    str(samples),
                    "--epochs",
                    str(epochs),
                )
        lm = self.foundations / "markov"
        if not (lm / "model.safetensors").is_file():
            self.raysim("pretrain", "markov", "--out", str(lm))
        metas = {
            p.name: json.loads((p / "raysim_foundation.json").read_text())
            for p in sorted(self.foundations.iterdir())
        }
        from raysim.models.foundation import weights_digest

        found = {
            name: {
                **{
                    k: v
                    for k, v in m.items()
                    if k.startswith("heldout_") or k in ("samples", "epochs", "parameters")
                },
                "weights_sha256": weights_digest(self.foundations / name),
            }
            for name, m in metas.items()
        }
        before = self.results.get("foundations", {})
        differ = [
            n for n, f in found.items() if n in before and before[n].get("weights_sha256") not in
            (None, f["weights_sha256"])
        ]  # fmt: skip
        if differ and any(k.startswith(("vision/", "lm/")) for k in self.results):
            raise SystemExit(
                f"the foundations {', '.join(differ)} are not the ones these results were run on "
                "(another machine pre-trains other weights): resume where they were made, or start "
                "a new --out"
            )
        self.results["foundations"] = found
        self.save()

    # ----------------------------------------------------------------- sweeps
    def base(self, path: Path, foundation: str) -> dict[str, Any]:
        raw = yaml.safe_load(path.read_text())
        raw["workers"] = {"count": 1, "num_cpus": 0.5}  # one worker per trial, trials side by side
        raw["tracking"] = {"experiment": "fedbaf-mini-reproduction", "uri": self.uri}
        raw["algorithm"]["foundation"] = str((self.foundations / foundation).resolve())
        raw["audit"] = {"leaks": False}  # on in the grid it would stop weight-init (claim 7)
        if self.quick:
            raw["rounds"] = 20
        return raw

    def sweep(self, label: str, raw: dict[str, Any], metric: str, mode: str) -> dict[str, Any]:
        if label in self.results:
            return self.results[label]
        from raysim import tune

        raw = copy.deepcopy(raw)
        raw["name"] = f"fedbaf-mini-{label.replace('/', '-')}"
        raw["tune"] = {
            "metric": metric,
            "mode": mode,
            "search": "grid",
            "space": {"seed": {"grid": self.seeds}},
        }
        t0 = time.time()
        summary = tune(raw, storage=(self.out / "tune" / label).resolve())
        table = [dict(row) for row in summary.table]
        for row in table:
            if row.get("run_id"):
                row["history"] = metric_histories(self.uri, row["run_id"], HISTORY_KEYS)
        self.results[label] = {
            "parent_run_id": summary.parent_run_id,
            "table": table,
            "seconds": time.time() - t0,
            "machine": machine(),
        }
        self.save()
        print(f"{label}: {len(summary.table)} runs in {time.time() - t0:.0f} s")
        return self.results[label]

    def vision_cell(
        self, method: str, base: str, part: str, attack: str, foundation: str = "digits-600-e20"
    ) -> dict[str, Any]:
        raw = self.base(VISION, foundation)
        algo = raw["algorithm"]
        algo.update({"base": base, "base_params": BASES[base], **METHODS[method]})
        for key, value in PARTITIONS[part].items():
            set_key(raw, key, value)
        zeta, lam = ATTACKS[attack]
        raw["hooks"] = {"clients": attack_hooks(zeta, lam, "multiply")}
        label = f"vision/{method}/{base}/{part}/{attack}"
        if foundation != "digits-600-e20":
            label += f"/{foundation}"
        return self.sweep(label, raw, "accuracy", "max")

    def vision(self) -> None:
        for part in PARTITIONS:
            for base in BASES:
                for method in METHODS:
                    self.vision_cell(method, base, part, "z0")
            for attack in list(ATTACKS)[1:]:
                for method in METHODS:
                    self.vision_cell(method, "fedavg", part, attack)

    def claim6(self) -> None:
        """ψ = 0 against plain FedAvg (the same seeds): equal digests mean bit for bit."""
        raw = self.base(VISION, "digits-600-e20")
        raw["algorithm"] = {"name": "fedavg"}
        self.sweep("vision/plain_fedavg/iid", raw, "accuracy", "max")

    def quality(self) -> None:
        for samples, epochs in QUALITY:
            name = f"digits-{samples}-e{epochs}"
            if name != "digits-600-e20":
                for part in PARTITIONS:
                    self.vision_cell("fedbaf", "fedavg", part, "z0", name)

    def lm(self) -> None:
        for method in METHODS:
            for attack in ("z0", "z0.5l5"):
                label = f"lm/{method}/{attack}"
                raw = self.base(LM, "markov")
                raw["algorithm"].update(METHODS[method])
                zeta, lam = ATTACKS[attack]
                raw["hooks"] = {"clients": attack_hooks(zeta, lam, "divide")}
                self.sweep(label, raw, "perplexity", "min")

    # ----------------------------------------------------------------- security
    def security(self) -> None:
        import raysim
        from raysim.security.audit import LeakError
        from raysim.security.report import extract

        raw = self.base(VISION, "digits-600-e20")
        raw["rounds"] = 20
        raw["audit"] = {"leaks": True}
        if "audit" not in self.results:
            audit = {}
            for variant in ("mix", "weight_init"):
                cfg = copy.deepcopy(raw)
                cfg["algorithm"]["variant"] = variant
                cfg["name"] = f"fedbaf-mini-audit-{variant}"
                try:
                    res = raysim.run(cfg)
                    audit[variant] = {"tripped": False, "run_id": res.run_id}
                except LeakError as e:
                    audit[variant] = {"tripped": True, "message": str(e)[:300]}
            self.results["audit"] = audit
            self.save()
        for label, fraction in (("full", 1.0), ("half", 0.5)):
            key = f"extraction/{label}"
            if key in self.results:
                continue
            cfg = copy.deepcopy(raw)
            cfg["name"] = f"fedbaf-mini-observed-{label}"
            cfg["hooks"] = {
                "clients": [
                    {
                        "name": "observe",
                        "dir": str((self.out / "observers" / label).resolve()),
                        "fraction": fraction,
                    }
                ]
            }
            res = raysim.run(cfg)
            out = extract(res.run_id, self.uri, noise_errors=(0, 0.1, 0.25, 0.5, 1.0, 1.27, 2.0))
            self.results[key] = {
                "attacked_run_id": res.run_id,
                "harness_run_id": out.run_id,
                "summary": out.summary,
                "noise": out.noise,
                "dist_and_c": [
                    {"round": a.round, "dist": a.dist, "c": out.c_by_round.get(a.round - 1)}
                    for a in out.attempts
                    if a.attack == "broadcast"
                ],
                "e1": [a.row() for a in out.attempts if a.attack == "E1"],
            }
            self.save()

    def run(self) -> None:
        self.pretrain()
        self.vision()
        self.claim6()
        self.lm()
        self.security()
        if not self.quick:
            self.quality()
        self.save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/fedbaf-mini"))
    ap.add_argument("--quick", action="store_true", help="2 seeds, 20 rounds: a look")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    Reproduction(args.out, args.quick).run()
    print(f"results in {args.out / 'results.json'}; write the report with report.py")


if __name__ == "__main__":
    main()
