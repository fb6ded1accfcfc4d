"""A run's strategy under its ``privacy`` section: what the accountant assumes of the sampling,
and the wrapped strategy (``private``). numpy only; no Ray."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raysim.algorithms.base import Strategy

if TYPE_CHECKING:
    from raysim.config import RunConfig

    from .accounting import Schedule

NO_AMPLIFICATION = (
    "privacy: clients' delays make a round draw from the idle clients only, not from all of "
    "them as the accountant's sampling analysis assumes; ε is accounted without amplification "
    "by sampling (each aggregation a whole Gaussian mechanism), an upper bound"
)


@dataclass(frozen=True)
class AccountedSampling:
    """``per_round_expected``: the clients a round dispatches on average; ``accounted``: the
    sampling the accountant analyses; ``notices``: what the run should say about it."""

    per_round_expected: int
    accounted: Schedule
    notices: tuple[str, ...] = ()


def sampling_of(cfg: RunConfig) -> AccountedSampling:
    """The clock's sampling as the accountant sees it. Without delays every round draws from
    all N clients: fixed-size (``uniform``) or ``poisson``, amplified by sampling. With delays
    a round draws from the idle clients only, which no analysis covers: no amplification."""
    from .accounting import Schedule

    n, s = cfg.clients.num, cfg.clients.per_round
    kind = "poisson" if cfg.clients.sampling == "poisson" else "without_replacement"
    if cfg.delays.kind == "none":
        return AccountedSampling(s, Schedule(n, s, kind))
    return AccountedSampling(s, Schedule(n, n, kind), (NO_AMPLIFICATION,))


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
