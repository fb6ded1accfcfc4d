"""A whole run in one process, without Ray: ``CoordinatorCore`` + ``InProcessExecutor``.

For tests, benchmarks and debugging a method: the same core, strategy, server context and client
runner as a Ray run, so results are the same as with any number of workers.
"""

from __future__ import annotations

from raysim.actors.coordinator import CoordinatorCore
from raysim.actors.executor import InProcessExecutor
from raysim.actors.worker import ClientRunner
from raysim.config import RunConfig
from raysim.data import FederatedDataset, build_federated_dataset
from raysim.runtime import GlobalEvaluator, data_spec, method_resident, server_context


def local_core(
    cfg: RunConfig, dataset: FederatedDataset | None = None, *, evaluate: bool = False
) -> CoordinatorCore:
    """A core for ``cfg`` whose client jobs run lazily in this process (dense datasets evaluate
    on the coordinator's model when ``evaluate``)."""
    ds = dataset or build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    handle = method_resident(cfg, data_spec(ds))
    evaluator = GlobalEvaluator(handle, ds) if evaluate and ds.input_kind != "causal_lm" else None
    runner = ClientRunner(cfg, ds)
    return CoordinatorCore(
        cfg,
        handle.get_global(),
        ds.client_sizes(),
        InProcessExecutor(runner),
        evaluator,
        server=server_context(cfg, ds, handle.layout()),
    )
