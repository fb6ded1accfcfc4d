"""What the accountant assumes of a run's client sampling (``sampling_of``). numpy only; no Ray;
imported by the wrapper (``wrap``) and the private strategy (``server``) alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raysim.config import RunConfig

    from .accounting import Schedule

NO_AMPLIFICATION = (
    "privacy: clients' delays make a round draw from the idle clients only, not from all of "
    "them as the accountant's sampling analysis assumes; ε is accounted without amplification "
    "by sampling (each aggregation a whole Gaussian mechanism), an upper bound"
)


NO_AMPLIFICATION_DEVICES = (
    "privacy: devices make a round draw from the clients available then, not from all of them "
    "as the accountant's sampling analysis assumes; ε is accounted without amplification by "
    "sampling (each aggregation a whole Gaussian mechanism), an upper bound"
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
    a round draws from the idle clients only, with devices from the available ones, which no
    analysis covers: no amplification."""
    from .accounting import Schedule

    n, s = cfg.clients.num, cfg.clients.per_round
    kind = "poisson" if cfg.clients.sampling == "poisson" else "without_replacement"
    if cfg.devices.enabled:
        return AccountedSampling(s, Schedule(n, n, kind), (NO_AMPLIFICATION_DEVICES,))
    if cfg.delays.kind == "none":
        return AccountedSampling(s, Schedule(n, s, kind))
    return AccountedSampling(s, Schedule(n, n, kind), (NO_AMPLIFICATION,))
