"""Small helpers shared by the coordinator and workers (no Ray, no MLflow). Loads without torch:
a coordinator whose method computes in numpy never imports it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.algorithms.context import ServerContext, ServerData, ServerPool
from raysim.algorithms.registry import get_method
from raysim.config import RunConfig
from raysim.data import FederatedDataset
from raysim.models.layout import DEFAULT_GROUPS, Layout, ParamGroup
from raysim.models.registry import DataSpec, ModelConfig, build_handle

if TYPE_CHECKING:
    import torch

    from raysim.models.handle import ModelHandle
    from raysim.training.tasks import Task

INIT_STREAM = 0x1417


def data_spec(dataset: FederatedDataset) -> DataSpec:
    return DataSpec(
        input_kind=dataset.input_kind,
        feature_shape=tuple(dataset.feature_shape),
        num_classes=dataset.num_classes,
        vocab_size=dataset.vocab_size,
        pad_id=getattr(dataset, "pad_id", 0),
    )


def init_seed(seed: int) -> int:
    """The seed under which every process builds the resident model (same init everywhere)."""
    return int(np.random.SeedSequence([seed, INIT_STREAM]).generate_state(1)[0])


def build_resident(
    cfg: ModelConfig,
    spec: DataSpec,
    seed: int,
    groups: Sequence[ParamGroup] = DEFAULT_GROUPS,
    wrap: Callable[[torch.nn.Module, DataSpec], torch.nn.Module] | None = None,
) -> ModelHandle:
    """Build the model under the run's init stream, so every process holds the same weights
    (``wrap``: the method's ``wrap_model`` with its params bound)."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(init_seed(seed))
        return build_handle(cfg, spec, groups, wrap)


def method_resident(cfg: RunConfig, spec: DataSpec) -> ModelHandle:
    """The resident model of a run: its method's parameter groups and model wrapper."""
    method = get_method(cfg.algorithm.name)
    wrap = method.wrap_model
    bound = None if wrap is None else lambda m, s: wrap(m, s, cfg.algorithm.params)
    return build_resident(cfg.model, spec, cfg.seed, method.groups, bound)


def server_model(cfg: RunConfig, spec: DataSpec) -> tuple[ModelHandle, Task]:
    """A resident model and its task for the server's own computation (its device: ``auto``
    picks the coordinator's GPU when ``coordinator.num_gpus`` gives it one)."""
    from raysim.training.tasks import task_for

    handle = method_resident(cfg, spec)
    return handle, task_for(spec, next(handle.module.parameters()).device)


def server_data(dataset: FederatedDataset) -> ServerData:
    """The dataset's server-side splits as tensors in the clients' format."""
    id_pool = None
    if getattr(dataset, "server_id", None) is not None:
        x, y = dataset.server_id
        id_pool = ServerPool(_tensors(x, y), dataset.num_classes)
    ood = {
        name: ServerPool(_tensors(x, y), int(c))
        for name, (x, y, c) in (getattr(dataset, "server_ood", None) or {}).items()
    }
    return ServerData(id_pool, ood)


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    import torch  # only a run with server data needs it here

    return torch.tensor(x), torch.tensor(y)


def run_dataset(cfg: RunConfig) -> Any:
    """The run's dataset, with the evaluation sets its client behaviours add (a backdoor's
    triggered inputs); built once, on the coordinator."""
    from raysim.algorithms.registry import BEHAVIOURS
    from raysim.data import build_federated_dataset

    dataset = build_federated_dataset(cfg.data, cfg.clients.num, cfg.seed)
    extra: dict = {}
    for name, params in cfg.client_hooks():
        extra.update(BEHAVIOURS.get(name).build(params).eval_sets(dataset))
    if cfg.eval.train:
        extra["global_train"] = training_rows(dataset)
    if extra:
        if not isinstance(dataset, FederatedDataset):
            raise ValueError(f"client behaviours adding {sorted(extra)} need a labelled dataset")
        dataset.extra_eval = extra
    return dataset


#: ``eval.train``'s limit: the rows of every client, held on every worker
MAX_TRAIN_EVAL_ROWS = 1_000_000


def training_rows(dataset: Any) -> Any:
    """Every client's training rows as one labelled set (``eval.train``), refused in one line
    where they are not labelled rows or too many to hold."""
    from raysim.data import LabelledSet

    if not isinstance(dataset, FederatedDataset):
        raise ValueError("eval.train scores a classification dataset's training rows; this "
                         "dataset has none: set eval.train false")  # fmt: skip
    rows = int(dataset.client_sizes().sum())
    if rows > MAX_TRAIN_EVAL_ROWS:
        raise ValueError(
            f"eval.train would hold all {rows} training rows on every worker (at most "
            f"{MAX_TRAIN_EVAL_ROWS}): set eval.train false, or use fewer clients"
        )
    parts = [dataset.client_data(j) for j in range(dataset.num_clients)]
    return LabelledSet(np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]))


def attacking_clients(cfg: RunConfig) -> list[dict[str, Any]]:
    """Each client behaviour with the clients it applies to (None: all) and its rounds, as
    fixed at setup (``attackers.json`` of the run)."""
    from raysim.algorithms.registry import BEHAVIOURS

    rows = []
    for name, params in cfg.client_hooks():
        b = BEHAVIOURS.get(name).build(params)
        b.setup(cfg.seed, cfg.clients.num)
        members = None if b.members is None else sorted(b.members)
        rows.append({"behaviour": name, "clients": members, "rounds": params.rounds})
    return rows


def server_context(cfg: RunConfig, dataset: FederatedDataset, layout: Layout) -> ServerContext:
    """The ``ServerContext`` of a run: seed streams, layout, server data and a lazily built
    server model (``Strategy.setup``)."""
    spec = data_spec(dataset)
    return ServerContext(
        cfg.seed,
        layout,
        cfg.clients.num,
        client_sizes=dataset.client_sizes(),
        data=server_data(dataset),
        local=cfg.local,
        model_factory=lambda: server_model(cfg, spec),
        clients_per_round=cfg.clients.per_round,
    )


def initial_weights(cfg: RunConfig, dataset: FederatedDataset) -> np.ndarray:
    """Initial global vector (from the run seed's init stream)."""
    return method_resident(cfg, data_spec(dataset)).get_global()


def weights_digest(weights: np.ndarray) -> str:
    """sha256 of the float32 little-endian bytes of a weight vector."""
    return hashlib.sha256(np.ascontiguousarray(weights, dtype="<f4").tobytes()).hexdigest()
