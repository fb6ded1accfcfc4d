"""A whole run in one process, without Ray: ``CoordinatorCore`` + ``InProcessExecutor``.

For tests, benchmarks and debugging a method: the same core, strategy, server context and client
runner as a Ray run, so results are the same as with any number of workers.
"""

from __future__ import annotations

from raysim.actors.coordinator_core import CoordinatorCore
from raysim.actors.evaluation import evaluator_for
from raysim.actors.executor import InProcessExecutor
from raysim.actors.worker import ClientRunner
from raysim.config import RunConfig
from raysim.data import FederatedDataset
from raysim.sim.build import run_dataset, server_context


def local_core(
    cfg: RunConfig, dataset: FederatedDataset | None = None, *, evaluate: bool = False
) -> CoordinatorCore:
    """A core for ``cfg`` whose client jobs (and, when ``evaluate``, evaluation jobs) run lazily
    in this process. ``clients.state.store: auto`` is decided here as a run's plan decides it
    (``raysim.launch.store_choice.choose_store``): the core's ``cfg`` has ``memory`` or ``disk``."""
    from raysim.launch.store_choice import choose_store

    cfg, _ = choose_store(cfg)
    ds = dataset or run_dataset(cfg)
    runner = ClientRunner(cfg, ds)
    executor = InProcessExecutor(runner)
    initial, layout = executor.initial_global()
    return CoordinatorCore(
        cfg,
        initial,
        ds.client_sizes(),
        executor,
        evaluator_for(cfg, ds, executor) if evaluate else None,
        server=server_context(cfg, ds, layout),
    )
