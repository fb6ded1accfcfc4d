"""How the coordinator gets client jobs done: the ``Executor`` interface and an in-process one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from raysim.actors.jobs import ClientJob, ClientResult, EvalJob, job_groups, one_or_each


class Executor(Protocol):
    """Runs client jobs somewhere; results are fetched by job id, in any order.

    ``group_size``: how many of a submission's jobs train together (cut by ``job_groups``);
    1 where each trains alone."""

    group_size: int

    def put(self, weights: np.ndarray) -> Any:
        """Publish one global model version once; the handle is passed to ``submit``."""

    def get(self, handle: Any) -> Any:
        """The value behind a handle: a published version, or a personal state a result left
        with the executor (``ClientResult.state``); in-process handles are the values."""

    def submit(self, handle: Any, jobs: list[ClientJob]) -> None:
        """Start jobs on the version behind ``handle`` (or a list of one handle per job: jobs
        dispatched on several versions, trained together); may run eagerly in the
        background."""

    def result(self, job_id: int) -> ClientResult:
        """Block until the job's result is there."""

    def evaluate(self, handle: Any, jobs: list[EvalJob]) -> Callable[[], list[dict[str, float]]]:
        """Start evaluation jobs on the version behind ``handle``; the returned call waits for
        their results, in job order. Jobs submitted after them queue behind them."""

    def events(self) -> list[str]:
        """Worker events (restarts) since the last call, for the run's log."""

    def sum_counts(self) -> tuple[int, dict[str, float]]:
        """Bytes that reached the coordinator through partial sums, and the reducers' seconds
        by node, since the last call (``workers.partial_sums``); (0, {}) where none."""

    def kill_worker(self, index: int) -> None:
        """Fault injection: kill one worker (it is replaced, its jobs re-run)."""

    def describe(self) -> list[dict[str, Any]]:
        """One dict per worker (placement, jobs run)."""

    def close(self) -> None: ...


class InProcessExecutor:
    """Runs jobs lazily in the calling process with one ``ClientRunner`` (no Ray)."""

    def __init__(self, runner: Any, where: dict[str, Any] | None = None) -> None:
        """``where``: what ``describe`` adds about this process (its node, its pid)."""
        self.runner = runner
        self.where = dict(where or {})
        self._pending: dict[int, tuple[np.ndarray, ClientJob]] = {}
        self._together: dict[int, list[ClientJob]] = {}  # job id → the group it trains in
        self._done: dict[int, ClientResult] = {}

    @property
    def group_size(self) -> int:
        return self.runner.group_size

    def initial_global(self) -> tuple[np.ndarray, Any]:
        """The model's initial global vector and its layout (``ClientRunner.initial_global``)."""
        return self.runner.initial_global()

    def put(self, weights: np.ndarray) -> np.ndarray:
        return weights

    def get(self, handle: Any) -> Any:
        return handle

    def submit(self, handle: Any, jobs: list[ClientJob]) -> None:
        handles = handle if isinstance(handle, list) else [handle] * len(jobs)
        for job, h in zip(jobs, handles, strict=True):
            self._pending[job.job_id] = (h, job)
        if self.runner.group_size > 1:
            for group in job_groups(jobs, self.runner.group_size):
                for job in group:
                    self._together[job.job_id] = group

    def result(self, job_id: int) -> ClientResult:
        if job_id in self._done:
            return self._done.pop(job_id)
        weights, job = self._pending.pop(job_id)
        group = self._together.pop(job_id, None)
        if group is None or not self.runner.trains_together(len(group)):
            return self.runner.run(weights, job)
        starts = {job_id: weights}
        for other in group:
            if other.job_id != job_id:
                starts[other.job_id] = self._pending.pop(other.job_id)[0]
                self._together.pop(other.job_id)
        versions = one_or_each([starts[other.job_id] for other in group])
        for result in self.runner.run_batch(versions, group):
            self._done[result.job_id] = result
        return self._done.pop(job_id)

    def evaluate(
        self, handle: np.ndarray, jobs: list[EvalJob]
    ) -> Callable[[], list[dict[str, float]]]:
        results = self.runner.evaluate_batch(handle, jobs)  # in process: now, in order asked
        return lambda: results

    def events(self) -> list[str]:
        return []

    def sum_counts(self) -> tuple[int, dict[str, float]]:
        return 0, {}

    def kill_worker(self, index: int) -> None:  # nothing to kill in-process
        pass

    def describe(self) -> list[dict[str, Any]]:
        return [{"worker": 0, **self.runner.usage(), "mode": "in_process", **self.where}]

    def close(self) -> None:
        self._pending.clear()
        self._together.clear()
        self._done.clear()
