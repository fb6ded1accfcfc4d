"""A run's strategy under its ``privacy`` section, wrapped (``private``). numpy only; no Ray."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from raysim.algorithms.base import Strategy

from .sampling import sampling_of

if TYPE_CHECKING:
    from raysim.config import RunConfig


def private(strategy: Strategy, cfg: RunConfig) -> Strategy:
    """``strategy`` wrapped by ``PrivateStrategy`` where ``privacy.mode`` is not none or the
    clients train with DP-SGD (``local.dp_sgd``, accounted at the server)."""
    sgd = cfg.local.dp_sgd
    if not cfg.privacy.enabled and sgd is None:
        return strategy
    from .server import PrivateStrategy

    sampling = sampling_of(cfg)
    per_sum = strategy.updates_per_aggregation(sampling.per_round_expected)
    planned = math.ceil(cfg.rounds * sampling.per_round_expected / per_sum)
    delta = cfg.privacy.delta_for(cfg.clients.num)
    ledger = None
    if sgd is not None:
        from .sample_level import SampleLevelLedger

        ledger = SampleLevelLedger(cfg.local.batch_size, sgd.noise_multiplier, sgd.delta)
    return PrivateStrategy(
        strategy, cfg.privacy, sampling, delta, planned, cfg.rounds, sample_level=ledger
    )
