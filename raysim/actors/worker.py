"""A worker: one resident model, many virtual clients run through it one after another."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch

from raysim.actors.jobs import ClientJob, ClientResult
from raysim.algorithms.registry import get_method
from raysim.data import FederatedDataset
from raysim.models import DataSpec, build_model
from raysim.models.params import get_flat, set_flat
from raysim.runtime import data_spec
from raysim.training.loop import make_optimizer

#: Clients whose data tensors a runner keeps (oldest dropped first).
TENSOR_CACHE_CLIENTS = 1024


class ClientRunner:
    """Builds the model once; swaps clients by loading a weight vector, never by rebuilding.

    Plain Python so it runs inside a Ray actor (``Worker``) or in-process (local executor, tests).
    """

    def __init__(
        self,
        config: Any,
        dataset: FederatedDataset | None,
        threads: int = 1,
        spec: DataSpec | None = None,
    ) -> None:
        from raysim.config import RunConfig

        torch.set_num_threads(threads)
        self.cfg = config if isinstance(config, RunConfig) else RunConfig.model_validate(config)
        self.dataset = dataset
        self.model = build_model(self.cfg.model, spec or data_spec(dataset))
        method = get_method(self.cfg.algorithm.name)
        self.client_algorithm = method.client(self.cfg.algorithm.params)
        self.jobs_run = 0
        self.busy_s = 0.0
        self._tensors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # torch.optim imports torch._dynamo lazily on first use (~1.5 s); pay it at start-up.
        make_optimizer(list(self.model.parameters()), self.cfg.local)

    def _client_tensors(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's data as tensors, cached (bounded) so repeat visits cost nothing."""
        hit = self._tensors.get(client)
        if hit is None:
            x, y = self.dataset.client_data(client)
            hit = torch.tensor(np.asarray(x)), torch.tensor(np.asarray(y), dtype=torch.long)
            if len(self._tensors) >= TENSOR_CACHE_CLIENTS:
                self._tensors.pop(next(iter(self._tensors)))
            self._tensors[client] = hit
        return hit

    def run(self, weights: np.ndarray, job: ClientJob) -> ClientResult:
        set_flat(self.model, weights)
        x, y = self._client_tensors(job.client)
        seed = job.seed
        torch.default_generator.manual_seed(seed)  # dropout etc.; cheaper than torch.manual_seed
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
        generator = torch.Generator().manual_seed(seed)
        metrics = self.client_algorithm.train(self.model, x, y, self.cfg.local, generator)
        delta = get_flat(self.model) - weights
        if job.corrupt:
            delta[0] = np.float32("nan" if job.corrupt == "nan" else "inf")
        self.jobs_run += 1
        return ClientResult(job.job_id, job.client, delta, len(y), metrics)

    def run_batch(self, weights: np.ndarray, jobs: list[ClientJob]) -> list[ClientResult]:
        t0 = time.perf_counter()
        out = [self.run(weights, job) for job in jobs]
        self.busy_s += time.perf_counter() - t0
        return out


class Worker(ClientRunner):
    """The Ray actor form of ``ClientRunner`` (wrapped with ``ray.remote`` by the pool).

    The dataset is not a constructor argument (Ray cannot guarantee restarts for actors whose
    constructor arguments live in the object store, ray-project/ray#53727): every batch carries
    its object ref, nested in a list so that Ray does not resolve it, and the worker fetches it
    (zero-copy) on its first batch, after a restart included.
    """

    def __init__(self, config: Any, spec: DataSpec, threads: int = 1) -> None:
        super().__init__(config, None, threads, spec=spec)

    def run_batch(
        self, weights: np.ndarray, jobs: list[ClientJob], data: list[Any] | None = None
    ) -> list[ClientResult]:
        if self.dataset is None:
            import ray

            self.dataset = ray.get(data[0])
        return super().run_batch(weights, jobs)

    def info(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "pid": os.getpid(),
            "node_id": ctx.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "jobs_run": self.jobs_run,
            "busy_s": self.busy_s,
            "torch_threads": torch.get_num_threads(),
            "base_params": sum(p.numel() for p in self.model.parameters()),
        }
