"""``raysim tune``: a Ray Tune search over raysim runs, recorded in MLflow as one parent run (the
space, the table, plots, the best config) with one child run per trial."""

from __future__ import annotations

import difflib
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from ray.tune import Callback

from raysim.config import ConfigError, RunConfig, has_unchecked, load_config
from raysim.sweeps import early
from raysim.sweeps.space import TuneSection
from raysim.sweeps.trial import (
    DIGEST,
    FINISHED_AT,
    ROUND,
    RUN_ID,
    RunTrial,
    trial_overrides,
)

#: written next to Tune's experiment state so that ``--resume DIR`` finds its sweep again
SWEEP_FILE = "raysim_sweep.json"
#: the best trial's config, next to the sweep's state
BEST_FILE = "best_config.yaml"


class SweepInterrupted(KeyboardInterrupt):
    """The sweep stopped before every trial ended; ``path`` continues it (``resume=path``)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


@dataclass
class SweepSummary:
    """What ``raysim.tune`` gives back."""

    metric: str
    mode: str
    best_params: dict[str, Any]
    best_config: dict[str, Any]
    best_metric: float
    table: list[dict[str, Any]]
    parent_run_id: str | None
    path: str
    stopped_early: list[str] = field(default_factory=list)


def sweep_section(cfg: RunConfig, space: Mapping[str, Any] | None = None) -> TuneSection:
    """The config's ``tune:`` section (``space`` replaces its space); refused if there is none."""
    if cfg.tune is None and space is None:
        raise ConfigError("raysim tune needs a tune: section with a space (or space=...)")
    raw = cfg.tune.model_dump() if cfg.tune is not None else {}
    if space is not None:
        raw["space"] = dict(space)
    try:
        section = TuneSection.model_validate(raw)
    except ValueError as e:
        raise ConfigError(f"tune: {e}") from None
    a = section.asha
    if section.scheduler == "asha" and a.grace_period > (a.max_t or cfg.rounds):
        last = f"tune.asha.max_t={a.max_t}" if a.max_t else f"rounds={cfg.rounds}"
        raise ConfigError(
            f"tune.asha.grace_period={a.grace_period} is past a trial's last round ({last}): "
            f"set tune.asha.grace_period to at most {a.max_t or cfg.rounds}, or run more rounds"
        )
    return section


def check_space(base: Mapping[str, Any], section: TuneSection) -> None:
    """Every swept key, at values that stand for its domain, through the run's own schema:
    a wrong key or value fails here, before Ray starts, naming the key."""
    if section.metric in section.space:
        raise ConfigError(f"tune.metric={section.metric!r} is also a swept key")
    for key, domain in section.space.items():
        for value in domain.representatives():
            try:
                load_config(base, trial_overrides({key: value}))
            except ConfigError as e:
                raise ConfigError(f"tune.space.{key} = {value!r}: {e}") from None


def _base(cfg: RunConfig) -> dict[str, Any]:
    """The trials' config: the sweep's without its ``tune:`` section, with the tracking store
    resolved here, where the user started the sweep (a trial runs in another process)."""
    from raysim.tracking.store import default_tracking_uri

    d = cfg.to_dict()
    d["tune"] = None
    if cfg.tracking.enabled:
        d["tracking"]["uri"] = cfg.tracking.uri or default_tracking_uri()
    return d


def tune(
    config: str | Path | Mapping[str, Any] | RunConfig,
    overrides: Iterable[str] = (),
    *,
    space: Mapping[str, Any] | None = None,
    address: str | None = None,
    resume: str | Path | None = None,
    storage: str | Path = "tune",
    on_result: Callable[[str, Mapping[str, Any]], None] | None = None,
    dry_run: bool = False,
) -> SweepSummary | str:
    """Run the sweep described by the config's ``tune:`` section (docs/tune.md). With
    ``dry_run`` everything is checked, nothing starts, and a one-line plan comes back."""
    from ray import tune as rtune
    from ray.tune.execution.class_cache import _ActorClassCache

    from raysim.launch.placement import (
        check_outlives_job,
        check_state_outlives_job,
        check_store_outlives_job,
    )
    from raysim.launch.trials import describe_sweep, plan_sweep

    # trials that an interrupt left unstarted have no results yet: Tune warns about each of them
    # when it reads the experiment back (at the interrupt, and again on --resume)
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # at a Ctrl-C Tune names Tuner.restore; raysim says `raysim tune ... --resume` itself
    logging.getLogger("ray.tune.tune").setLevel(logging.ERROR)

    cfg = load_config(config, overrides)
    section = sweep_section(cfg, space)
    base = _base(cfg)
    check_space(base, section)
    check_store_outlives_job(base["tracking"]["uri"] if cfg.tracking.enabled else None)
    check_state_outlives_job(cfg)
    storage_path = Path(storage).expanduser().resolve()
    check_outlives_job(
        Path(resume) if resume is not None else storage_path,
        "the sweep's state",
        "give --storage a path outside it, e.g. --storage ~/raysim-store/tune",
    )
    if resume is not None and not (Path(resume) / SWEEP_FILE).is_file():
        raise ConfigError(f"{resume} is not a raysim sweep's directory (no {SWEEP_FILE})")
    if dry_run and has_unchecked(cfg):  # a dry run imported none of the config's modules
        return (
            f"dry run: sweep space valid; {cfg.algorithm.name!r} is registered only by a module "
            "the config names, which a dry run does not import (it runs no code): its "
            "parameters and each trial's placement are checked when the sweep starts"
        )
    uri = base["tracking"]["uri"] if cfg.tracking.enabled else None
    cwd = os.getcwd()  # before Ray is joined (``plan_sweep``: a Ray job's copy may go then)
    sweep = plan_sweep(cfg, section, address, uri, dry_run=dry_run)
    if dry_run:
        return describe_sweep(cfg, section, sweep.bundles, sweep.total, sweep.here, sweep.trial)
    bundles, here = sweep.bundles, sweep.here
    trainable_params: dict[str, Any] = {
        "base": base,
        "parent_run_id": None,
        "metric": section.metric,
        "cwd": cwd,
        "worker_here": here,
        "decisions": decision_rounds(section, cfg.rounds),
    }
    name = f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    tracker = _SweepRun(cfg, section) if cfg.tracking.enabled else None
    if resume is not None:
        state = json.loads((Path(resume) / SWEEP_FILE).read_text())
        trainable_params["parent_run_id"] = state["parent_run_id"]
        if tracker is not None:
            tracker.reopen(state["parent_run_id"])
    elif tracker is not None:
        trainable_params["parent_run_id"] = tracker.start(name)
    trainable = rtune.with_resources(
        rtune.with_parameters(RunTrial, **trainable_params),
        rtune.PlacementGroupFactory(bundles, strategy="PACK"),
    )
    from ray.tune.logger import CSVLoggerCallback

    # each trial's progress.csv feeds the sweep's learning curves; Tune's JSON and TensorBoard
    # loggers would add about 10 ms to every round (benchmarks/RESULTS.md) and nothing reads them
    callbacks = [_TrialRuns(tracker.uri if tracker else None, cfg.rounds), CSVLoggerCallback()]
    _TrialRuns.display = on_result  # not in the callback's state: Tune pickles that
    early.publish(early_launch(cfg, bundles, here))  # withdrawn below, however the sweep ends
    try:
        if resume is not None:
            tuner = rtune.Tuner.restore(
                str(Path(resume).resolve()),
                trainable,
                resume_unfinished=True,
                resume_errored=True,
                param_space=section.param_space(),
            )
            path = str(Path(resume).resolve())
        else:
            tuner = rtune.Tuner(
                trainable,
                param_space=section.param_space(),
                tune_config=rtune.TuneConfig(
                    metric=section.metric,
                    mode=section.mode,
                    num_samples=section.num_samples,
                    max_concurrent_trials=section.max_concurrent_trials,
                    scheduler=_scheduler(section, cfg.rounds),
                    reuse_actors=True,  # a trial's process serves the next (RunTrial.reset_config)
                ),
                run_config=rtune.RunConfig(
                    name=name,
                    storage_path=str(storage_path),
                    callbacks=callbacks,
                    verbose=0,
                    # nothing to keep (RunTrial.save_checkpoint); Tune takes a trial's reports
                    # one at a time where it would save a checkpoint at the trial's end
                    checkpoint_config=rtune.CheckpointConfig(checkpoint_at_end=False),
                ),
            )
            path = str(storage_path / name)
            Path(path).mkdir(parents=True, exist_ok=True)
            (Path(path) / SWEEP_FILE).write_text(
                json.dumps({"parent_run_id": trainable_params["parent_run_id"]})
            )
        settings = {
            # Tune adds its default result loggers unless the first is set when fit starts; its
            # newer console output prints the experiment's table and path even at verbose=0
            "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
            "RAY_AIR_NEW_OUTPUT": "0",
            # any length above 1 has the controller take a trial's reports several at a time
            # (RunTrial.train_buffered, which sets its own limits)
            "TUNE_RESULT_BUFFER_LENGTH": "2",
        }
        with (  # trials in the worker processes Ray keeps idle (_plain_trainable)
            mock.patch.dict(os.environ, settings),
            mock.patch.object(_ActorClassCache, "get", _plain_trainable(_ActorClassCache.get)),
            warnings.catch_warnings(),
        ):
            # ASHA's cut over a rung where no trial has the metric (a misspelt tune.metric,
            # named by _check_metric_reported at the end)
            warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
            grid = tuner.fit()
    except BaseException:
        if tracker is not None:
            tracker.end("KILLED")
        raise
    finally:
        _TrialRuns.display = None
        early.publish(None)
    if _unfinished(path):  # Ctrl-C: Tune saved its state and returned
        if tracker is not None:
            tracker.end("KILLED")
        raise SweepInterrupted(path)
    summary = _summarize(
        grid, section, base, cfg.rounds, trainable_params["parent_run_id"], path, cfg.tracking.uri
    )
    if tracker is not None:
        tracker.finish(summary, grid)
    return summary


def _plain_trainable(tune_get: Callable[[Any, type], Any]) -> Callable[[Any, type], Any]:
    """In place of ``tune_get`` (``_ActorClassCache.get``, how Tune's controller makes a
    trainable an actor class): the class without the runtime environment Tune gives every
    trainable only to set ``PL_DISABLE_FORK`` (for PyTorch Lightning, which raysim does not
    use). A process with a runtime environment of its own, and the workers it starts (they
    inherit it), can use none of the worker processes Ray keeps idle, and each waited for a new
    one (about 0.8 s on 2 vCPUs, ``benchmarks/RESULTS.md``). Where the driver has a variable
    that Tune passes on to trainables (cloud credentials, Ray Train's settings), Tune's own way
    is kept."""
    import ray
    from ray.tune.execution.class_cache import ENV_VARS_TO_PROPAGATE

    def get(cache: Any, trainable: type) -> Any:
        if any(name in os.environ for name in ENV_VARS_TO_PROPAGATE):
            return tune_get(cache, trainable)
        if trainable not in cache._cache:
            cache._cache[trainable] = ray.remote(trainable)
        return cache._cache[trainable]

    return get


def early_launch(cfg: RunConfig, bundles: list[dict[str, float]], here: bool) -> Any:
    """The ``WorkerLaunch`` each trial's process starts as it loads (``raysim.sweeps.early``):
    the base config's, where a trial's coordinator runs in its process and its workers are
    actors; else None."""
    from raysim.actors.pool import WorkerLaunch
    from raysim.launch.session import can_host_coordinator

    if here or not can_host_coordinator(cfg):
        return None
    return WorkerLaunch.for_config(cfg, len(bundles) - 2)


def _unfinished(path: str) -> bool:
    """Whether the sweep's saved state has trials still to run (it was interrupted)."""
    from ray.tune import ExperimentAnalysis

    return any(t.status not in ("TERMINATED", "ERROR") for t in ExperimentAnalysis(path).trials)


def _scheduler(section: TuneSection, rounds: int) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if section.scheduler == "fifo":
        return FIFOScheduler()
    a = section.asha
    return ASHAScheduler(
        time_attr=ROUND,
        max_t=a.max_t or rounds,
        grace_period=a.grace_period,
        reduction_factor=a.reduction_factor,
    )


def decision_rounds(section: TuneSection, rounds: int) -> tuple[int, ...]:
    """The rounds at which the sweep's scheduler may stop a trial (``_scheduler``): ASHA's rungs
    (``grace_period`` times powers of ``reduction_factor``, below ``max_t``) and ``max_t``; none
    for FIFO. A trial sends a report that reaches one of them at once (``RunTrial``)."""
    if section.scheduler == "fifo":
        return ()
    a = section.asha
    max_t = a.max_t or rounds
    rungs, milestone = [], a.grace_period
    while milestone < max_t:
        rungs.append(milestone)
        milestone *= a.reduction_factor
    return (*rungs, max_t)


#: what Tune adds to every result, besides the run's metrics
TUNE_KEYS = frozenset(
    {
        "done",
        "training_iteration",
        "time_this_iter_s",
        "time_total_s",
        "timestamp",
        "pid",
        "time_since_restore",
        "iterations_since_restore",
        "should_checkpoint",
    }
)


def _check_metric_reported(grid: Any, metric: str, parent: str | None) -> None:
    """A ``ConfigError`` naming what the runs did report, where none reported ``metric`` as a
    number (a misspelt ``tune.metric`` runs every trial to its end, each scoring NaN)."""
    reported = {
        k
        for result in grid
        for k, v in (result.metrics or {}).items()
        if isinstance(v, (int, float)) and v == v and k not in TUNE_KEYS | {ROUND, FINISHED_AT}
    }
    if not reported or metric in reported:
        return
    close = difflib.get_close_matches(metric, sorted(reported), 1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = f"; the trials' runs are under MLflow run {parent}" if parent else ""
    raise ConfigError(
        f"tune.metric={metric!r} is not a metric the runs report{hint}; they report "
        f"{', '.join(sorted(reported))}{where}"
    )


def _summarize(
    grid: Any,
    section: TuneSection,
    base: Mapping[str, Any],
    rounds: int,
    parent: str | None,
    path: str,
    tracking_uri: str | None,
) -> SweepSummary:
    rows, stopped = [], []
    for result in grid:
        last = result.metrics or {}
        params = {k: result.config.get(k) for k in section.space}
        done = int(last.get(ROUND, 0))
        status = "error" if result.error else ("finished" if done >= rounds else "stopped early")
        if status == "stopped early":
            stopped.append(last.get(RUN_ID, ""))
        rows.append(
            {
                **params,
                section.metric: last.get(section.metric, float("nan")),
                "rounds": done,
                "status": status,
                "run_id": last.get(RUN_ID, ""),
                DIGEST: last.get(DIGEST, ""),
            }
        )
    finished = [
        r for r in rows if r["status"] == "finished" and r[section.metric] == r[section.metric]
    ]
    if not finished:
        _check_metric_reported(grid, section.metric, parent)
        raise RuntimeError(f"no trial finished with {section.metric!r}; see {path}")
    sign = 1 if section.mode == "max" else -1
    best = max(finished, key=lambda r: sign * r[section.metric])
    best_params = {k: best[k] for k in section.space}
    best_config = load_config(base, trial_overrides(best_params)).to_dict()
    best_config.pop("tune", None)
    best_config["tracking"]["uri"] = tracking_uri  # as the user gave it (None: the default)
    (Path(path) / BEST_FILE).write_text(yaml.safe_dump(best_config, sort_keys=False))
    return SweepSummary(
        metric=section.metric,
        mode=section.mode,
        best_params=best_params,
        best_config=best_config,
        best_metric=float(best[section.metric]),
        table=rows,
        parent_run_id=parent,
        path=path,
        stopped_early=[s for s in stopped if s],
    )


class _SweepRun:
    """The sweep's parent MLflow run, written by the driver (trials write their own runs)."""

    def __init__(self, cfg: RunConfig, section: TuneSection) -> None:
        from raysim.tracking.store import default_tracking_uri, open_store

        self.cfg, self.section = cfg, section
        self.uri = cfg.tracking.uri or default_tracking_uri()
        self.client = open_store(self.uri)
        self.run_id: str | None = None

    def start(self, name: str) -> str:
        from raysim.tracking.store import ensure_experiment

        exp = ensure_experiment(self.client, self.cfg.tracking.experiment)
        s = self.section
        run = self.client.create_run(
            exp, run_name=f"tune · {name}", tags={"raysim.kind": "sweep", **self.cfg.tracking.tags}
        )
        self.run_id = run.info.run_id
        for key, value in {
            "tune.space": json.dumps(
                {k: d.model_dump(exclude_none=True) for k, d in s.space.items()}
            ),
            "tune.metric": s.metric,
            "tune.mode": s.mode,
            "tune.num_samples": s.num_samples,
            "tune.scheduler": s.scheduler,
            "tune.search": s.search,
            "rounds": self.cfg.rounds,
        }.items():
            self.client.log_param(self.run_id, key, str(value)[:6000])
        return self.run_id

    def reopen(self, run_id: str | None) -> None:
        self.run_id = run_id
        if run_id:
            self.client.update_run(run_id, status="RUNNING")

    def end(self, status: str) -> None:
        """End the sweep's run, and any trial run its stopped trial left RUNNING."""
        if not self.run_id:
            return
        exp = self.client.get_run(self.run_id).info.experiment_id
        children = self.client.search_runs(
            [exp], f"tags.`mlflow.parentRunId` = '{self.run_id}' and attributes.status = 'RUNNING'"
        )
        for child in children:
            self.client.set_terminated(child.info.run_id, "KILLED")
        self.client.set_terminated(self.run_id, status)

    def finish(self, summary: SweepSummary, grid: Any) -> None:
        import tempfile

        from raysim.sweeps.report import write_report

        with tempfile.TemporaryDirectory() as tmp:
            write_report(Path(tmp), summary, grid)
            self.client.log_artifacts(self.run_id, tmp)
        self.client.log_metric(self.run_id, f"best_{summary.metric}", summary.best_metric)
        self.client.set_terminated(self.run_id, "FINISHED")


class _TrialRuns(Callback):
    """Driver-side: a trial that ends before its last round (ASHA stopped it, or it failed)
    leaves its MLflow run KILLED and tagged ``raysim.stopped_early``, or FAILED; never RUNNING.
    Tune pickles its callbacks with the sweep's state and a resumed sweep gets them back from
    there, so the instance holds only the store's URI; the live display (``tune``'s
    ``on_result``) is the class's ``display`` while a sweep runs, resumed ones included."""

    display: Callable[[str, Mapping[str, Any]], None] | None = None

    def __init__(self, uri: str | None, rounds: int) -> None:
        self.uri, self.rounds = uri, rounds

    def _mark(self, run_id: str, status: str, stopped_early: bool) -> None:
        from raysim.tracking.store import open_store

        client = open_store(self.uri)
        if stopped_early:
            client.set_tag(run_id, "raysim.stopped_early", "true")
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, status)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any):
        if _TrialRuns.display is not None:
            _TrialRuns.display(str(trial), result)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any):
        last = trial.last_result or {}
        if self.uri and last.get(RUN_ID) and last.get(ROUND, 0) < self.rounds:
            self._mark(last[RUN_ID], "KILLED", stopped_early=True)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any):
        last = trial.last_result or {}
        if self.uri and last.get(RUN_ID):
            self._mark(last[RUN_ID], "FAILED", stopped_early=False)
