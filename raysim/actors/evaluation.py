"""The one evaluator: jobs that score model versions on the workers, for every model family.

The method chooses what answers for a known client (FedOA spec §2.9, FedOT spec §6.5):
``Method.evaluate_with`` names the parameter group (the global one, or a personal group whose
state the client keeps), and a ``ClientAlgorithm.adapt`` override (for example fine-tuning
before testing) makes every client evaluate its own adapted copy. Then each client is scored on
every shared set and its own test split, and the metrics are the mean over clients (with their
spread: ``_std``, ``_min``); the global model is scored on the shared sets too, with a
``_global`` suffix. With per-client input shifts (``data.shift``, FedOT spec §6.5) every client
is scored too, each on the test set in its own view, even where the global model answers.
Otherwise the global model answers everywhere, with bare metric names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any

import numpy as np

from raysim.actors.jobs import EvalJob

#: the classification test set: its metrics keep bare names (``accuracy``, ``loss``)
BARE_SET = "test"
#: rng = default_rng([seed, EVAL_SAMPLE_TAG]) draws ``eval.clients``' sample
EVAL_SAMPLE_TAG = 0xE7A1


def metric_key(eval_set: str, metric: str) -> str:
    """``test`` → ``accuracy``; ``ood`` → ``ood_loss``; ``id/3`` → ``id_loss``."""
    if eval_set == BARE_SET:
        return metric
    kind = "id" if eval_set.startswith("id/") else eval_set
    return f"{kind}_{metric}"


class WorkerEvaluator:
    """Builds the evaluation jobs of one model version, runs them on the executor, averages."""

    def __init__(
        self,
        executor: Any,
        eval_sets: Mapping[str, int | None],
        group: str,
        eval_cfg: Any,
        *,
        global_group: str = "global",
        adapt: bool = False,
        num_clients: int = 0,
        seed: int = 0,
        shifted: bool = False,
    ) -> None:
        self.executor = executor
        self.shared = tuple(name for name, client in eval_sets.items() if client is None)
        self.own = {client: name for name, client in eval_sets.items() if client is not None}
        self.group = group
        self.global_group = global_group
        self.adapt = adapt
        self.num_clients = num_clients
        self.seed = seed
        self.shifted = shifted
        self.cfg = eval_cfg
        self.last_clients: list[dict[str, Any]] = []
        #: ``eval.clients``: the clients a per-client evaluation scores where no personal state
        #: decides (drawn once; sorted), None: all of them
        n = getattr(eval_cfg, "clients", None)
        self.sample: list[int] | None = None
        if n is not None and n < num_clients:
            rng = np.random.default_rng([seed, EVAL_SAMPLE_TAG])
            self.sample = sorted(rng.choice(num_clients, size=n, replace=False).tolist())

    @property
    def per_client(self) -> bool:
        """Whether each client answers with its own view (personal state, adaptation, or its
        own shift of the inputs: ``data.shift``)."""
        return self.group != self.global_group or self.adapt or self.shifted

    def state_dict(self) -> dict[str, Any]:
        """The last per-client evaluation rows (joined into ``clients.csv`` at the end)."""
        return {"last_clients": [dict(r) for r in self.last_clients]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last_clients = [dict(r) for r in state.get("last_clients", [])]

    def jobs(self, states: Mapping[int, dict], final: bool, round: int = 0) -> list[EvalJob]:
        gen = self.cfg.rouge == "every" or (self.cfg.rouge == "final" and final)
        common = {"generate": gen, "run_seed": self.seed, "round": round}
        jobs = [EvalJob(0, self.shared, **common)] if self.shared else []
        if not self.per_client:
            for j in sorted(self.own) if self.cfg.id else []:
                jobs.append(EvalJob(len(jobs), (self.own[j],), j, **common))
            return jobs
        personal = self.group != self.global_group
        n = getattr(self.cfg, "clients", None)
        if personal:  # states are kept in the order clients first had one: the first n of them
            clients = sorted(islice(states, n) if n else states)
        else:
            clients = self.sample if self.sample is not None else range(self.num_clients)
        for j in clients:
            sets = self.shared + ((self.own[j],) if self.cfg.id and j in self.own else ())
            if sets:
                state = states.get(j) if personal else None
                jobs.append(EvalJob(len(jobs), sets, j, self.group, state, self.adapt, **common))
        return jobs

    def __call__(
        self,
        weights: np.ndarray,
        states: Mapping[int, dict] | None = None,
        final: bool = False,
        round: int = 0,
    ) -> dict[str, float]:
        return self.submit(weights, states, final, round)()

    def submit(
        self,
        weights: np.ndarray,
        states: Mapping[int, dict] | None = None,
        final: bool = False,
        round: int = 0,
        handle: Any = None,
    ) -> Callable[[], dict[str, float]]:
        """The evaluation started now (its jobs queued on the workers ahead of any submitted
        later); the returned call waits for it and gives the metrics, as ``__call__`` does.
        ``handle``: ``weights`` published already (``Executor.put``), not put again."""
        jobs = self.jobs(states or {}, final, round)
        handle = self.executor.put(weights) if handle is None else handle
        fetch = self.executor.evaluate(handle, jobs)
        return lambda: self._summarise(jobs, fetch())

    def _summarise(self, jobs: list[EvalJob], results: list[dict]) -> dict[str, float]:
        """The jobs' scores as run metrics (means over clients, their spread, the global model's
        scores), and each client's row for ``clients.csv``."""
        suffix = "_global" if self.per_client else ""
        out: dict[str, float] = {}
        per_client: dict[str, list[float]] = {}
        rows: dict[int, dict[str, Any]] = {}
        for job, res in zip(jobs, results, strict=True):
            for eval_set, scores in res.items():
                for metric, value in scores.items():
                    key = metric_key(eval_set, metric)
                    if job.client is None:
                        out[key + suffix] = value
                        continue
                    per_client.setdefault(key, []).append(value)
                    row = rows.setdefault(
                        job.client, {"client": job.client, "evaluated_with": job.group}
                    )
                    row[key] = value
        for key, values in per_client.items():
            out[key] = float(np.mean(values))  # mean over clients (FedOA spec §4.6)
            if self.per_client:
                out[f"{key}_std"] = float(np.std(values))
                out[f"{key}_min"] = float(np.min(values))
        if self.per_client:
            out["clients_evaluated"] = float(len(rows))
        self.last_clients = [rows[j] for j in sorted(rows)]
        return out


def evaluator_for(cfg: Any, dataset: Any, executor: Any) -> WorkerEvaluator:
    """The run's evaluator, as its method chooses (``Method.evaluate_with``, ``adapt``)."""
    from raysim.algorithms.registry import get_method

    method = get_method(cfg.algorithm.name)
    return WorkerEvaluator(
        executor,
        {name: es.client for name, es in dataset.eval_sets.items()},
        method.evaluate_with,
        cfg.eval,
        global_group=method.groups[0].name,
        adapt=method.adapts_for_eval,
        num_clients=cfg.clients.num,
        seed=cfg.seed,
        shifted=getattr(dataset, "shifts", None) is not None,
    )
