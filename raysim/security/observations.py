"""What colluding clients know (FedBaF spec §6.2): the broadcasts they received, their own updates,
and the aggregates ``w'`` they rebuild from those with the base method's public rules.

The ``observe`` behaviour writes one record per job; ``read_observations`` groups them by round.
``rebuild_aggregates`` replays the run's public server update (FedAvg's weighted mean, FedProx's
damping, FedAdam's moments from its hyperparameters), without the FedBaF mix, on the observed
updates of each round: exact when every participant of the round colluded, an estimate otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raysim.algorithms.base import Strategy, Update
from raysim.algorithms.fedbaf.mixer import FedBaF
from raysim.algorithms.hooks import ComposedStrategy
from raysim.algorithms.registry import MIXERS, get_method


@dataclass
class ObservedRound:
    """Round ``t`` as the observers saw it: the broadcast ``w_t`` and (client, delta, n) each."""

    received: np.ndarray
    updates: list[tuple[int, np.ndarray, int]] = field(default_factory=list)

    @property
    def clients(self) -> list[int]:
        return [c for c, _, _ in self.updates]


def read_observations(folder: str | Path) -> dict[int, ObservedRound]:
    """The observers' records in ``folder``, by dispatch round, clients in id order."""
    from safetensors import safe_open

    folder = Path(folder).expanduser()
    files = sorted(folder.glob("r*_c*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no observer records in {folder}: run with hooks.clients: "
            f"[{{name: observe, dir: {folder}}}]"
        )
    rounds: dict[int, ObservedRound] = {}
    for f in files:
        with safe_open(str(f), "np") as rec:
            meta = rec.metadata()
            t = int(meta["dispatch_round"])
            received, delta = rec.get_tensor("received"), rec.get_tensor("delta")
        r = rounds.setdefault(t, ObservedRound(received))
        if not np.array_equal(r.received, received):
            raise ValueError(f"observers of round {t} received different models (async run?)")
        r.updates.append((int(meta["client"]), delta, int(meta["num_samples"])))
    return dict(sorted(rounds.items()))


def public_strategy(cfg: Any, initial: np.ndarray) -> Strategy:
    """The run's server update without FedBaF's private mix: what colluders can replay."""
    method = get_method(cfg.algorithm.name)
    strategy = method.strategy(cfg.algorithm.params, initial, cfg.clients.num)
    base, mixers = (
        (strategy.base, list(strategy.mixers))
        if isinstance(strategy, ComposedStrategy)
        else (strategy, [])
    )
    mixers += [MIXERS.get(h.name).build(h.params) for h in cfg.hooks.server]
    return ComposedStrategy(base, [m for m in mixers if not isinstance(m, FedBaF)])


def rebuild_aggregates(cfg: Any, rounds: dict[int, ObservedRound]) -> dict[int, np.ndarray]:
    """``w'_{t+1}`` for every observed round ``t``, replayed in round order on the observed
    updates; a server optimiser's state carries over as the real one's did."""
    if not rounds:
        return {}
    first = next(iter(rounds.values())).received
    strategy = public_strategy(cfg, first)
    out: dict[int, np.ndarray] = {}
    for t, r in rounds.items():
        strategy.weights = np.array(r.received, dtype=np.float32, copy=True)
        for client, delta, n in r.updates:
            strategy.on_arrival(Update(client, delta, n, t, 0, t + 0.5, t, 0, r.received))
        strategy.on_round_end(t)
        out[t] = np.array(strategy.weights, copy=True)
    return out
