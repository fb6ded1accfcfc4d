"""Secure aggregation's effects on a run's rounds (``privacy.secure_aggregation``), the server's
half; the client's half (its clipped delta rounded to the encoding's grid) is in ``clipping``.

One protocol per round, over the clients dispatched in it (Bonawitz et al. 2017; Bell et al.
2020, SecAgg+): each may drop out (``dropout``, drawn from the run's seed); the server learns the
sum of the survivors' encoded deltas, or nothing where fewer than ``threshold`` of the round's
clients survive. The fixed-point sum cannot wrap: the headroom for the round's clients at the
round's C is checked before the sum (``secagg.check_headroom``), and before the run for S clients.
Survivors' encoded values are multiples of 2^-f, so the run's exact sum equals the decoded
modular sum to within m·2^-41 (the fixed-point sum's own rounding of each weighted term).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raysim.algorithms.base import Update
from raysim.algorithms.context import ServerContext
from raysim.errors import PrivacyError

from . import secagg
from .settings import SecureAggregation

#: a round's dropouts: default_rng([the server stream "privacy/dropout", round])
DROPOUT_STREAM = "privacy/dropout"


def secagg_config(s: SecureAggregation, clip: float) -> secagg.SecAggConfig:
    return secagg.SecAggConfig(
        modulus_bits=s.modulus_bits, scale_bits=s.scale_bits, clip=clip, threshold=s.threshold
    )


def checked(s: SecureAggregation, clip: float, clients: int, noise_bound: float = 0.0) -> None:
    """Refuse, in one line, a round of ``clients`` whose modular sum could wrap (each value
    within C plus ``noise_bound``: distributed DP's noise)."""
    try:
        secagg.check_headroom(secagg_config(s, clip), clients, noise_bound)
    except secagg.SecAggOverflow as e:
        raise PrivacyError(
            f"privacy.secure_aggregation: {e} (raise modulus_bits or lower scale_bits)"
        ) from None


class SecureRounds:
    """Holds a round's arrivals until its end, then gives the survivors, or none."""

    def __init__(self, cfg: SecureAggregation, ctx: ServerContext, params: int) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.params = params
        self.started = 0
        self.dropped: set[int] = set()
        self.held: list[Update] = []
        #: the largest |value| a survivor sent this round (its clipped delta plus its noise)
        self.peak = 0.0
        self.failed_rounds = 0
        self._last: dict[str, float] = {}

    def start(self, round_index: int, clients: Sequence[int]) -> None:
        """A round's protocol begins with its dispatched ``clients``; some will drop out."""
        self.started = len(clients)
        self.held = []
        self.peak = 0.0
        rng = np.random.default_rng([self.ctx.stream_seed(DROPOUT_STREAM), round_index])
        drops = rng.random(len(clients)) < self.cfg.dropout
        self.dropped = {int(c) for c, d in zip(clients, drops, strict=True) if d}

    def admit(self, update: Update) -> None:
        """An arrival: held for the round's end, unless its client dropped out."""
        if update.client_id not in self.dropped:
            self.held.append(update)
            self.peak = max(self.peak, float(update.metrics.get(secagg.PEAK_METRIC, 0.0)))

    def finish(self, clip: float) -> list[Update]:
        """The round's survivors, whose sum the server learns; [] where they are too few."""
        survivors, self.held = self.held, []
        n = max(self.started, len(survivors))
        if not n:
            self._last = {}
            return []
        checked(self.cfg, clip, n, max(0.0, self.peak - clip))
        cfg = secagg_config(self.cfg, clip)
        need = secagg.required_survivors(cfg, n)
        enough = len(survivors) >= need
        if not enough:
            self.failed_rounds += 1
        cost = secagg.cost(cfg, n, self.params, self.cfg.protocol)
        self._last = {
            "secagg_survivors": float(len(survivors)),
            "secagg_round_failed": 0.0 if enough else 1.0,
            "secagg_failed_rounds": float(self.failed_rounds),
            "secagg_bytes_up": float(cost.bytes_up_per_client * n),
            "secagg_bytes_down": float(cost.bytes_down_per_client * n),
            "secagg_extra_rounds": float(cost.extra_rounds),
        }
        return survivors if enough else []

    def metrics(self) -> dict[str, float]:
        return dict(self._last)

    def state_dict(self) -> dict[str, Any]:
        return {"failed_rounds": self.failed_rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.failed_rounds = int(state.get("failed_rounds", 0))
