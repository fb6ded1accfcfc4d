"""Evaluation that runs on the workers, batched: the global adapter and each client's own adapter.

Which adapter answers for a known client is the method's ``eval_adapter`` (fedoa.md §2.9): the
personal one for personalised methods (intra-client OOD and ID), the global one otherwise. The
global adapter is always evaluated on the shared OOD set too (the inter-client case).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from raysim.actors.jobs import EvalJob


class WorkerEvaluator:
    """Builds evaluation jobs for the current global version and client states; averages them."""

    def __init__(
        self,
        executor: Any,
        eval_sets: Mapping[str, int | None],
        eval_adapter: str,
        eval_cfg: Any,
    ) -> None:
        self.executor = executor
        self.shared = [name for name, client in eval_sets.items() if client is None]
        self.own = {client: name for name, client in eval_sets.items() if client is not None}
        self.eval_adapter = eval_adapter
        self.cfg = eval_cfg
        self.last_clients: list[dict[str, Any]] = []

    def state_dict(self) -> dict[str, Any]:
        """The last per-client evaluation rows (joined into ``clients.csv`` at the end)."""
        return {"last_clients": [dict(r) for r in self.last_clients]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.last_clients = [dict(r) for r in state.get("last_clients", [])]

    def jobs(self, states: Mapping[int, dict], final: bool) -> list[EvalJob]:
        gen = self.cfg.rouge == "every" or (self.cfg.rouge == "final" and final)
        jobs = [EvalJob(i, name, "global", None, None, gen) for i, name in enumerate(self.shared)]
        personal = self.eval_adapter != "global"
        clients = sorted(states) if personal else sorted(self.own)
        for j in clients:
            state = states.get(j) if personal else None
            adapter = self.eval_adapter if personal else "global"
            sets = list(self.shared) if personal else []
            if self.cfg.id and j in self.own:
                sets.append(self.own[j])
            for name in sets:
                jobs.append(EvalJob(len(jobs), name, adapter, j, state, gen))
        return jobs

    def __call__(
        self, weights: np.ndarray, states: Mapping[int, dict] | None = None, final: bool = False
    ) -> dict[str, float]:
        jobs = self.jobs(states or {}, final)
        results = self.executor.evaluate(self.executor.put(weights), jobs)
        personal = self.eval_adapter != "global"
        out: dict[str, float] = {}
        groups: dict[str, list[float]] = {}
        rows: dict[int, dict[str, Any]] = {}
        for job, res in zip(jobs, results, strict=True):
            kind = "id" if job.eval_set.startswith("id/") else job.eval_set
            if job.client is None:
                suffix = "_global" if personal else ""
                for k, v in res.items():
                    out[f"{kind}_{k}{suffix}"] = v
                continue
            row = rows.setdefault(job.client, {"client": job.client, "adapter": job.adapter})
            for k, v in res.items():
                groups.setdefault(f"{kind}_{k}", []).append(v)
                row[f"{kind}_{k}"] = v
        for k, vals in groups.items():
            out[k] = float(np.mean(vals))  # mean over clients (fedoa.md §4.6)
        if personal:
            out["clients_evaluated"] = float(len({j.client for j in jobs if j.client is not None}))
        self.last_clients = [rows[j] for j in sorted(rows)]
        return out
