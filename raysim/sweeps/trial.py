"""One Tune trial is one raysim run: the base config with the sampled values as overrides,
validated by the run's own schema, stepped round by round through ``RunSession``, reporting every
round to Tune (so ASHA can stop it) and logging to its own MLflow run under the sweep's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from raysim.sweeps import early
from raysim.sweeps.ahead import ReportsAhead

early.start()  # a trial's process: its workers start before Tune's import below (early.py)

from ray import tune  # noqa: E402

from raysim.launch import trials  # noqa: E402

#: what every trial reports besides the run's per-round metrics (the last report also carries
#: the digest and when the run's artifacts were written, as epoch seconds)
ROUND, RUN_ID, DIGEST, FINISHED_AT = "round", "run_id", "weights_digest", "finished_at"

#: CPUs of a trial's own process (the first bundle of its placement group)
TRIAL_CPU = trials.TRIAL_CPU


def trial_overrides(params: Mapping[str, Any]) -> list[str]:
    """``key=value`` overrides for sampled values (JSON is YAML, so types survive)."""
    return [f"{key}={json.dumps(value)}" for key, value in sorted(params.items())]


def trial_config(
    base: Mapping[str, Any],
    params: Mapping[str, Any],
    parent_run_id: str | None = None,
    trial: str | None = None,
) -> Any:
    """The trial's ``RunConfig``: ``base`` with ``params`` applied, a child of the sweep's run."""
    from raysim.config import load_config

    cfg = load_config(base, trial_overrides(params))
    tags = dict(cfg.tracking.tags)
    if parent_run_id:
        tags["raysim.sweep"] = parent_run_id
    if trial:
        tags["raysim.trial"] = trial
    name = f"{trial} · {cfg.run_name()}" if trial else cfg.run_name()
    tracking = cfg.tracking.model_copy(
        update={"parent_run_id": parent_run_id, "run_name": name, "tags": tags}
    )
    return cfg.model_copy(update={"tracking": tracking})


def placement_share() -> dict[str, float] | None:
    """What the run inside this trial may use: its placement group's bundles, less the
    ``TRIAL_CPU`` that the trial's own process takes from the first (None outside a placement
    group). The first bundle also holds the worker's share where the trial trains it
    (``tune.worker=here``)."""
    from ray.util import get_current_placement_group

    pg = get_current_placement_group()
    if pg is None:
        return None
    return trials.trial_share(pg.bundle_specs)


class RunTrial(tune.Trainable):
    """The Tune trainable: one raysim run. Each ``step`` runs rounds up to the next one that
    measured ``metric`` (``eval.every``), or to the last, whose result carries the run's final
    value of it and the weights digest. ``cleanup`` closes the run, so a trial that ASHA stops
    ends its coordinator and workers itself (its MLflow run KILLED) before Tune ends the trial's
    process, instead of leaving them to die with their owner. The trial runs in ``cwd``, the
    sweep's directory where this node has it, so relative paths in the config mean what they
    mean to ``raysim run`` (Tune starts trials in their own directories). With Tune's
    ``reuse_actors`` the process goes on to the next trial (``reset_config``): the old run is
    closed, and the new one starts in the same placement group without a new process. With
    ``worker_here`` (``tune.worker=here``, where the sweep found it possible) the run's one
    worker trains in this process too.

    Rounds run ahead while Tune's controller takes in the last reports (``train_buffered``),
    except past a round on which the scheduler may stop the trial (``decisions``)."""

    def setup(
        self,
        config: dict[str, Any],
        *,
        base: dict[str, Any],
        parent_run_id: str | None,
        metric: str,
        cwd: str | None = None,
        worker_here: bool = False,
        decisions: tuple[int, ...] = (),
    ) -> None:
        import logging
        import os

        # Tune's own notes from this process (a setup over 10 s, each end-of-trial checkpoint)
        for name in ("ray.tune", "ray.train"):
            logging.getLogger(name).setLevel(logging.WARNING)
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        self.metric, self.base, self.parent_run_id = metric, base, parent_run_id
        self.worker_here, self.decisions = worker_here, decisions
        self._start(config)

    def _start(self, config: dict[str, Any]) -> None:
        """The trial's run starts at its first ``step`` (``_session``), not here: with
        ``reuse_actors`` Tune may set up a process for a trial and then stop it unstepped, giving
        the trial to a process it had kept. Started here, that run would stay in MLflow as a
        second child run of the trial, KILLED with no round (seen in 1 of 4 two-node sweeps)."""
        self._config, self.session = config, None
        self._last_round, self._ahead = 0, None

    def _session(self) -> Any:
        if self.session is None:
            from raysim.launch.session import RunSession

            cfg = trial_config(self.base, self._config, self.parent_run_id, self.trial_name)
            # the coordinator runs in this process, which Tune started for the trial anyway
            self.session = RunSession(
                cfg,
                resources=placement_share(),
                coordinator_here=True,
                worker_here=self.worker_here,
                started=early.take,
            )
        return self.session

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """The next trial in this process (Tune's ``reuse_actors``): its own run, from scratch."""
        self.cleanup()
        self._start(new_config)
        return True

    def step(self) -> dict[str, Any]:
        import time

        session = self._session()
        while True:
            metrics = dict(session.step())
            if session.done:  # the last round: finish first, so the result carries the digest
                result = session.finish()
                metrics[DIGEST] = result.weights_digest
                metrics[FINISHED_AT] = time.time()
                metrics.setdefault(self.metric, result.metrics.get(self.metric, float("nan")))
                metrics["done"] = True
            elif self.metric not in metrics:
                continue
            out = {**metrics, ROUND: session.round, RUN_ID: session.run_id or ""}
            if session.done:  # its actors go now, not when Tune reuses or stops this process
                self._end_run()
            return out

    def train_buffered(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
        """This trial's next reports, for Tune's controller to take in one call: the first
        alone, so that a sweep shows each trial's start at once; then, while the controller
        takes them in, the next rounds run ahead in a thread (``ReportsAhead``), up to each round
        on which the scheduler may stop the trial (``decisions``). The controller's own limits
        (its arguments) are not used: none of them knows the scheduler's rounds."""
        if self._ahead is None:
            report = self.train()  # the run starts here, in the actor's own thread
            if not report.get("done"):
                self._ahead = ReportsAhead(self.train, self._decides, self._decides(report))
            return [report]
        reports = self._ahead.take()
        if reports[-1].get("done"):  # its thread has ended: free it now, not as the process ends
            ahead, self._ahead = self._ahead, None
            ahead.stop()
        return reports

    def _decides(self, report: dict[str, Any]) -> bool:
        """Whether the scheduler may act on ``report``: its round reaches one of ``decisions``
        that the last report had not (called once per report, in order)."""
        before, self._last_round = self._last_round, report.get(ROUND, 0)
        return any(before < d <= self._last_round for d in self.decisions)

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        """Nothing to save: a trial that Tune restores (``raysim tune --resume``) starts its run
        over, as a function trainable's did; the run it left is KILLED in MLflow."""
        return {}

    def load_checkpoint(self, checkpoint: Any) -> None:
        """See ``save_checkpoint``."""

    def cleanup(self) -> None:
        ahead = getattr(self, "_ahead", None)
        if ahead is not None:
            self._ahead = None
            ahead.stop()
        self._end_run()

    def _end_run(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            self.session = None
            session.close()
