"""FedAvg (McMahan et al. 2017) on the virtual clock, as Feddle spec §4.2.

Round-synchronous: the round's arrivals R_k are averaged by sample count and *added* to the current
model at round end, stale deltas included (the "naive asynchronous" reading, Feddle spec Eq. 2/4):
``ω ← ω + Σ_{j∈R_k} n_j/Σn · Δ_j``; no arrival ⇒ no change (the version still increments, §2.4).
"""

from __future__ import annotations

import numpy as np

from ..base import Method, Strategy, Update, WeightedMean
from ..registry import register
from .params import METHODS


class RoundBuffer(Strategy):
    """A strategy that collects a round's arrivals and aggregates them at round end (through
    ``round_delta``: a sum, which the workers may take where the deltas are)."""

    sums_updates = True

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.pending: list[Update] = []

    def on_arrival(self, update: Update) -> bool:
        self.pending.append(update)
        return False

    def round_delta(self) -> np.ndarray | None:
        """Sample-size weighted mean of this round's deltas, or None if nothing arrived."""
        if not self.pending:
            return None
        total = sum(u.num_samples for u in self.pending)
        weights = [u.num_samples / total for u in self.pending]
        return WeightedMean.combine([u.delta for u in self.pending], weights)


class FedAvg(RoundBuffer):
    """Sample-weighted averaging of the round's deltas."""

    def on_round_end(self, round_index: int) -> bool:
        delta = self.round_delta()
        self.pending = []
        if delta is not None:
            self.weights = self.weights + delta
        return True


METHOD = register(Method.of(METHODS["fedavg"], strategy=FedAvg))
