"""``raysim extract``: run the extraction harness against a finished FedBaF run and log the
results as an MLflow run of their own (table, summary, plots), tagged with the run they attack.

The run must have had colluding observers (``hooks.clients: [{name: observe, dir: DIR}]``); the
harness reads their records, replays the public server update, runs E0/E1/E2, scores every
estimate against the foundation on the matched layers (relative error, cosine, the paper's Dist,
feature CKA) and, when the foundation carries its source task (``raysim pretrain``), the
noise-robustness sweep of Fig. 8 (``raysim.security.noise``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from raysim.algorithms.fedbaf.mixer import FedBaFParams, matched_foundation
from raysim.algorithms.registry import module_policy
from raysim.config import RunConfig, load_config
from raysim.security.harness import Attempt, FeatureProbe, Harness, summarize, tau_scope
from raysim.security.observations import read_observations, rebuild_aggregates

HARNESS_TAG = "raysim.extraction_of"
PROBE_ROWS = 512


@dataclass
class Extraction:
    """What ``extract`` measured, and where it logged it."""

    attempts: list[Attempt]
    summary: dict[str, float]
    noise: list[dict[str, float]] = field(default_factory=list)
    c_by_round: dict[int, float] = field(default_factory=dict)
    run_id: str | None = None


def fedbaf_params(cfg: RunConfig) -> FedBaFParams:
    """The FedBaF settings of a run: ``algorithm: fedbaf`` or a ``hooks.server`` fedbaf entry."""
    if cfg.algorithm.name == "fedbaf":
        p = cfg.algorithm.params
        return FedBaFParams(**{k: getattr(p, k) for k in FedBaFParams.model_fields})
    for h in cfg.hooks.server:
        if h.name == "fedbaf":
            return h.params
    raise ValueError(
        f"run {cfg.name!r} does not use FedBaF (algorithm {cfg.algorithm.name!r}, no fedbaf "
        "server hook): there is no foundation to extract"
    )


def observer_dir(cfg: RunConfig) -> str:
    for name, params in cfg.client_hooks():
        if name == "observe":
            return params.dir
    raise ValueError(
        f"run {cfg.name!r} had no observers: add hooks.clients: [{{name: observe, dir: DIR}}] "
        "(with fraction: 1.0 for full collusion) and run it again, or pass --observations"
    )


def resolve_run(
    ref: str, tracking_uri: str, trust_modules: bool = False
) -> tuple[RunConfig, str | None]:
    """A config from a YAML path, or from an MLflow run id's ``config.yaml`` (whose modules are
    imported only with ``trust_modules``: that code is not a file the user gave)."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return load_config(yaml.safe_load(path.read_text())), None
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    store = tracking_uri.removeprefix("sqlite:///")
    if tracking_uri.startswith("sqlite:///") and not Path(store).exists():
        raise ValueError(f"no run {ref!r}: the store {tracking_uri} does not exist")
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        client.get_run(ref)
        with tempfile.TemporaryDirectory() as tmp:
            local = client.download_artifacts(ref, "config.yaml", tmp)
            data = yaml.safe_load(Path(local).read_text())
    except (MlflowException, OSError) as e:
        raise ValueError(f"no run {ref!r} with a config.yaml in {tracking_uri}: {e}") from None
    with module_policy("import" if trust_modules else "refuse", f"MLflow run {ref}"):
        return load_config(data), ref


def _c_history(tracking_uri: str, run_id: str | None) -> dict[int, float]:
    if run_id is None:
        return {}
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, "fedbaf_c")
    return {int(m.step) - 1: float(m.value) for m in history}  # step: round number, 1-based


def extract(
    ref: str,
    tracking_uri: str,
    observations: str | None = None,
    foundation: str | None = None,
    noise_errors: tuple[float, ...] | None = None,
    log: bool = True,
    trust_modules: bool = False,
) -> Extraction:
    """Run the harness on ``ref`` (run id or config path); see the module docstring.
    ``trust_modules``: see ``resolve_run``."""
    from raysim.data import build_federated_dataset
    from raysim.sim.build import data_spec, method_resident
    from raysim.training.loop import evaluate

    cfg, run_id = resolve_run(ref, tracking_uri, trust_modules)
    params = fedbaf_params(cfg)
    dataset = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    handle = method_resident(cfg, data_spec(dataset))
    layout = handle.layout()
    truth = matched_foundation(
        layout, foundation or params.foundation, params.match, params.exclude
    )
    rounds = read_observations(observations or observer_dir(cfg))
    aggregates = rebuild_aggregates(cfg, rounds)
    probe = None
    if hasattr(dataset, "x_test"):  # a labelled dataset (not an instruction-tuning one)
        probe = FeatureProbe(handle, dataset.x_test[:PROBE_ROWS])

    def local_loss(client: int, weights: np.ndarray) -> float:
        import torch

        x, y = dataset.client_data(client)
        handle.set_global(np.asarray(weights, dtype=np.float32))
        return evaluate(handle.module, torch.as_tensor(x), torch.as_tensor(y))["loss"]

    harness = Harness(
        truth,
        rounds,
        aggregates,
        psi=params.psi,
        per_round=cfg.clients.per_round,
        probe=probe,
        local_loss=local_loss if probe is not None else None,
        tau_scope=tau_scope(layout, params.tau_scope, truth.indices),
    )
    attempts = harness.run(static_alpha=not params.alpha_random)
    result = Extraction(attempts, summarize(attempts), c_by_round=_c_history(tracking_uri, run_id))
    if noise_errors:
        from raysim.security.noise import noise_sweep

        result.noise = noise_sweep(foundation or params.foundation, truth, noise_errors, cfg.seed)
    if log:
        result.run_id = log_extraction(result, cfg, run_id, tracking_uri)
    return result


def log_extraction(
    result: Extraction, cfg: RunConfig, target: str | None, tracking_uri: str
) -> str:
    """An MLflow run in the attacked run's experiment: params, headline metrics, the table of
    every attempt, the noise sweep, and plots."""
    from mlflow.tracking import MlflowClient

    from raysim.tracking.artifacts import rows_csv

    client = MlflowClient(tracking_uri=tracking_uri)
    if target is not None:
        experiment_id = client.get_run(target).info.experiment_id
    else:
        exp = client.get_experiment_by_name(cfg.tracking.experiment)
        experiment_id = (
            exp.experiment_id if exp else client.create_experiment(cfg.tracking.experiment)
        )
    tags = {HARNESS_TAG: target or "", "raysim.kind": "extraction"}
    run = client.create_run(experiment_id, run_name=f"extract · {cfg.run_name()}", tags=tags)
    rid = run.info.run_id
    for key, value in result.summary.items():
        client.log_metric(rid, key, float(value))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "extraction.csv").write_text(rows_csv([a.row() for a in result.attempts]))
        (d / "summary.yaml").write_text(yaml.safe_dump(result.summary, sort_keys=True))
        if result.noise:
            (d / "noise.csv").write_text(rows_csv(result.noise))
        plot_extraction(result, d / "extraction.png")
        if result.noise:
            plot_noise(result, d / "noise.png")
        client.log_artifacts(rid, str(d))
    client.set_terminated(rid, "FINISHED")
    return rid


def plot_extraction(result: Extraction, path: Path) -> None:
    """Left: relative error of each attack by round (log scale). Right: the broadcasts' Dist to
    the foundation against the run's c_t (App. G.1 / Fig. 7)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=100)
    by_attack: dict[str, list[Attempt]] = {}
    for a in result.attempts:
        by_attack.setdefault(a.attack, []).append(a)
    for name, rows in sorted(by_attack.items()):
        ax.scatter(
            [a.round for a in rows], [max(a.relative_error, 1e-17) for a in rows], label=name, s=14
        )
    ax.set_yscale("log")
    ax.set_xlabel("round t")
    ax.set_ylabel("relative L2 error of ŵ_pre")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    casts = by_attack.get("broadcast", [])
    pairs = [(result.c_by_round.get(a.round - 1), a.dist) for a in casts]
    pairs = [(c, d) for c, d in pairs if c is not None]
    if pairs:
        bx.scatter(*zip(*pairs, strict=True), s=14)
        bx.set_xlabel("c_t of the mix that made the broadcast")
    else:
        bx.plot([a.round for a in casts], [a.dist for a in casts], marker=".")
        bx.set_xlabel("round t")
    bx.set_ylabel("Dist(w_t, w_pre) (App. G.1)")
    bx.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def draw_noise(ax: Any, rows: list[dict[str, Any]], dist: float | None) -> None:
    """Fig. 8's curves on ``ax``: source-task accuracy against the error rate, per noise mode,
    with the smallest Dist of the run's broadcasts as a dashed line."""
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        ax.plot(
            [r["error_rate"] for r in mine],
            [r["accuracy"] for r in mine],
            marker=".",
            label=f"noise ∝ {mode}",
        )
    if dist is not None:
        ax.axvline(dist, color="gray", ls="--", label=f"smallest Dist of the run ({dist:.2f})")
    ax.set_xlabel("error rate e = ‖noise‖ / ‖w_pre‖ per tensor")
    ax.set_ylabel("source-task accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def plot_noise(result: Extraction, path: Path) -> None:
    """Fig. 8's analogue for one harness run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=100)
    draw_noise(ax, result.noise, result.summary.get("broadcast_dist_min"))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
