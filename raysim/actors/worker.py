"""A worker: one resident model, many virtual clients run through it one after another."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from raysim.actors.jobs import ClientJob, ClientResult
from raysim.algorithms.registry import get_method
from raysim.data import FederatedDataset
from raysim.models import build_model
from raysim.models.params import get_flat, set_flat
from raysim.runtime import data_spec
from raysim.training.loop import make_optimizer


class ClientRunner:
    """Builds the model once; swaps clients by loading a weight vector, never by rebuilding.

    Plain Python so it runs inside a Ray actor (``Worker``) or in-process (local executor, tests).
    """

    def __init__(self, config: Any, dataset: FederatedDataset, threads: int = 1) -> None:
        from raysim.config import RunConfig

        torch.set_num_threads(threads)
        self.cfg = config if isinstance(config, RunConfig) else RunConfig.model_validate(config)
        self.dataset = dataset
        self.model = build_model(self.cfg.model, data_spec(dataset))
        method = get_method(self.cfg.algorithm.name)
        self.client_algorithm = method.client(self.cfg.algorithm.params)
        self.jobs_run = 0
        # torch.optim imports torch._dynamo lazily on first use (~1.5 s); pay it at start-up.
        make_optimizer(list(self.model.parameters()), self.cfg.local)

    def _client_tensors(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.dataset.client_data(client)
        return torch.tensor(np.asarray(x)), torch.tensor(np.asarray(y), dtype=torch.long)

    def run(self, weights: np.ndarray, job: ClientJob) -> ClientResult:
        set_flat(self.model, weights)
        x, y = self._client_tensors(job.client)
        torch.manual_seed(job.seed)
        generator = torch.Generator().manual_seed(job.seed)
        metrics = self.client_algorithm.train(self.model, x, y, self.cfg.local, generator)
        delta = get_flat(self.model) - weights
        if job.corrupt:
            delta[0] = np.float32("nan" if job.corrupt == "nan" else "inf")
        self.jobs_run += 1
        return ClientResult(job.job_id, job.client, delta, len(y), metrics)

    def run_batch(self, weights: np.ndarray, jobs: list[ClientJob]) -> list[ClientResult]:
        return [self.run(weights, job) for job in jobs]


class Worker(ClientRunner):
    """The Ray actor form of ``ClientRunner`` (wrapped with ``ray.remote`` by the pool).

    ``dataset`` arrives as a one-element list holding an object ref, resolved here (zero-copy).
    """

    def __init__(self, config: Any, dataset: list[Any], threads: int = 1) -> None:
        import ray

        super().__init__(config, ray.get(dataset[0]), threads)

    def info(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "pid": os.getpid(),
            "node_id": ctx.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "jobs_run": self.jobs_run,
            "torch_threads": torch.get_num_threads(),
            "base_params": sum(p.numel() for p in self.model.parameters()),
        }
