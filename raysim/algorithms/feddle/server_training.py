"""Training on the server: the shared pieces of Center, Fed+FT, HFCL and FedDF (Feddle spec §4).

The server trains the *shared* group of its own resident model (``ServerContext.model``) on its
data with a fresh optimiser per call, through the same ``train_local`` loop as the clients, so
one recipe means the same computation on either side.
"""

from __future__ import annotations

import numpy as np
import torch

from ...training.loop import LocalTrainingConfig, train_local
from ..context import ServerContext, ServerPool


def id_pool(ctx: ServerContext, method: str) -> ServerPool:
    """The in-distribution server set, or a clear error naming the config key."""
    if ctx.data.id is None:
        raise ValueError(f"{method} trains on in-distribution server data: set data.server.id_size")
    return ctx.data.id


def ood_sample(
    ctx: ServerContext, pool: str | None, samples: int | None, stream: str, method: str
) -> tuple[ServerPool, tuple[torch.Tensor, torch.Tensor]]:
    """An OOD pool (``pool``, default the first of ``data.server.ood``) and this call's data:
    a fresh uniform subset of ``samples`` rows drawn from the named stream, or the whole pool
    when ``samples`` is None or not smaller than it (Feddle spec §3.5, A12)."""
    pools = ctx.data.ood
    if not pools:
        raise ValueError(f"{method} needs an out-of-domain server pool: set data.server.ood")
    name = pool or next(iter(pools))
    if name not in pools:
        raise ValueError(f"{method}: no OOD pool {name!r}; data.server.ood has {sorted(pools)}")
    chosen = pools[name]
    x, y = chosen.data
    if samples is not None and samples < len(y):
        rng = ctx.rng(stream)
        pick = torch.as_tensor(np.sort(rng.choice(len(y), samples, False)))
        x, y = x[pick], y[pick]
    return chosen, (x, y)


def train_on_server(
    ctx: ServerContext,
    weights: np.ndarray,
    data,
    recipe: LocalTrainingConfig,
    stream: str,
    objective=None,
) -> tuple[np.ndarray, dict[str, float]]:
    """Train the server model's shared group from ``weights`` on ``data``; the new global vector.

    Shuffling and torch's global RNG (dropout) come from the named server stream ``stream``
    (name it by round, so a resumed run draws the same)."""
    handle, task = ctx.model()
    handle.set_global(weights)
    gen = ctx.torch_generator(stream)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.stream_seed(stream + "/global"))
        metrics = train_local(
            handle.module, handle.global_parameters(), task, data, recipe, gen, objective=objective
        )
    return handle.get_global(), metrics
