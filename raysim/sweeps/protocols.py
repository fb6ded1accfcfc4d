"""Evaluation protocols that span several runs: one MLflow parent run, a child per setting.

``leave_one_out`` runs every (held-out setting × method) pair of a base config and collects one
metric into a table shaped like the FedOA paper's Table 2 (methods × held-out settings + Average,
FedOA spec §5.1), logged to the parent run as CSV, Markdown and a PNG. Leave-one-task-out holds out
each task family in turn (``data.text.held_out``, FedOA spec §4.2).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raysim.config import RunConfig, load_config
from raysim.launch.session import Result, run
from raysim.tracking.store import default_tracking_uri, ensure_experiment, open_store

#: Method presets: overrides that turn a FedOA base config into each method of Table 2.
#: Centralized pools the training clients and trains once for 10 epochs (FedOA spec §3.1).
TABLE2_METHODS: dict[str, list[str]] = {
    "centralized": [
        "algorithm={name: centralized}",
        "clients.num=1",
        "clients.per_round=1",
        "rounds=1",
        "local.epochs=10",
        "data.text.pool_clients=true",
    ],
    "fedit": ["algorithm={name: fedit}"],
    "pfedme": ["algorithm={name: pfedme}"],
    "fedlora": ["algorithm={name: fedlora}"],
    "perada": ["algorithm={name: perada}"],
    "fedsdr": ["algorithm={name: fedsdr}"],
    "fedoa": [],
}
TASK_FAMILIES = ("entailment", "sentiment", "paraphrase", "reading_comprehension")


@dataclass
class ProtocolResult:
    """Every child result plus the metric table (``table[method][setting]``)."""

    parent_run_id: str | None
    metric: str
    settings: list[str]
    methods: list[str]
    table: dict[str, dict[str, float]] = field(default_factory=dict)
    results: dict[tuple[str, str], Result] = field(default_factory=dict)

    def average(self, method: str) -> float:
        vals = [self.table[method][s] for s in self.settings]
        return float(np.mean(vals)) if vals else float("nan")

    def markdown(self) -> str:
        head = "| method | " + " | ".join(self.settings) + " | Average |"
        rule = "|---" * (len(self.settings) + 2) + "|"
        lines = [head, rule]
        for m in self.methods:
            cells = [f"{self.table[m][s]:.2f}" for s in self.settings]
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {self.average(m):.2f} |")
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        rows = ["method," + ",".join(self.settings) + ",average"]
        for m in self.methods:
            vals = [f"{self.table[m][s]:.6g}" for s in self.settings]
            rows.append(",".join([m, *vals, f"{self.average(m):.6g}"]))
        return "\n".join(rows) + "\n"


def plot_table(result: ProtocolResult, path: Path) -> None:
    """Grouped bars: one group per held-out setting (+ Average), one bar per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*result.settings, "Average"]
    width = 0.8 / max(len(result.methods), 1)
    fig, ax = plt.subplots(figsize=(1.6 * len(groups) + 2, 3.8), dpi=100)
    x = np.arange(len(groups))
    for i, m in enumerate(result.methods):
        vals = [result.table[m][s] for s in result.settings] + [result.average(m)]
        ax.bar(x + i * width - 0.4 + width / 2, vals, width, label=m)
    ax.set_xticks(x, [g.replace("_", "\n") for g in groups])
    ax.set_ylabel(result.metric)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def leave_one_out(
    config: str | Path | Mapping[str, Any],
    overrides: Sequence[str] = (),
    *,
    key: str = "data.text.held_out",
    settings: Iterable[str] = TASK_FAMILIES,
    methods: Mapping[str, Sequence[str]] | Iterable[str] = ("fedit", "fedoa"),
    metric: str = "ood_rouge1",
    name: str = "leave-one-task-out",
    address: str | None = None,
    on_run: Callable[[str, str, Result], None] | None = None,
    dry_run: bool = False,
) -> ProtocolResult:
    """Run every held-out setting × method under one MLflow parent run; tabulate ``metric``.

    ``methods`` maps a label to extra overrides, or lists names of ``TABLE2_METHODS``. All child
    configs are validated before the first run starts; ``dry_run`` stops there (and checks that
    each run fits, ``raysim.launch.session.preflight``), returning an empty result.
    """
    if not isinstance(methods, Mapping):
        methods = {m: TABLE2_METHODS.get(m, [f"algorithm={{name: {m}}}"]) for m in methods}
    settings = list(settings)
    plan: dict[tuple[str, str], RunConfig] = {}
    for s in settings:
        for label, extra in methods.items():
            ov = [*overrides, f"{key}={s}", *extra]
            plan[(s, label)] = load_config(config, ov)  # fail early, before any run
    if dry_run:
        from raysim.launch.session import preflight

        for cfg in plan.values():
            preflight(cfg, address)
        return ProtocolResult(None, metric, settings, list(methods))
    base = next(iter(plan.values()))
    parent, client = None, None
    if base.tracking.enabled:
        uri = base.tracking.uri or default_tracking_uri()
        client = open_store(uri)
        exp_id = ensure_experiment(client, base.tracking.experiment)
        parent = client.create_run(exp_id, run_name=name, tags={"protocol": name}).info.run_id
        client.log_param(parent, "protocol.key", key)
        client.log_param(parent, "protocol.settings", ",".join(settings))
        client.log_param(parent, "protocol.methods", ",".join(methods))
    out = ProtocolResult(parent, metric, settings, list(methods))
    try:
        for (s, label), cfg in plan.items():
            tracking = cfg.tracking.model_copy(
                update={
                    "parent_run_id": parent,
                    "run_name": f"{label} · {s}",
                    "tags": {**cfg.tracking.tags, "protocol": name, "held_out": s, "method": label},
                }
            )
            res = run(cfg.model_copy(update={"tracking": tracking}), address=address)
            out.results[(s, label)] = res
            out.table.setdefault(label, {})[s] = float(res.metrics.get(metric, float("nan")))
            if on_run is not None:
                on_run(s, label, res)
    except BaseException:
        if client is not None:
            client.set_terminated(parent, "FAILED")
        raise
    if client is not None:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            (d / "table.csv").write_text(out.csv())
            (d / "table.md").write_text(out.markdown())
            plot_table(out, d / "table.png")
            client.log_artifacts(parent, str(d))
        for m in out.methods:
            client.log_metric(parent, f"{metric}_average.{m}", out.average(m))
        client.set_terminated(parent, "FINISHED")
    return out
