"""CA2FL (Wang et al., ICLR 2024) as Feddle spec §4.5 [O + P grid]: FedBuff with cached calibration.

The server caches each client's latest delta ``h_i`` (0 for all J clients at the start) and their
mean ``h̄ = (1/J) Σ_i h_i``. When the buffer holds K updates:
``v = h̄ + (1/K) Σ_{u∈buf} (Δ_u − h_{i(u)})`` (h, h̄ as before this flush), ``ω ← ω + η v``, then
``h_{i(u)} ← Δ_u`` for every buffered update (a client's latest wins) and h̄ is recomputed. No
staleness weighting. A partial buffer at the end of the run is dropped (§2.2). Memory: one delta
per client ever seen (Feddle spec §7.1 item 12).
"""

from __future__ import annotations

import numpy as np

from ..base import Method, Strategy, Update, WeightedMean
from ..registry import register
from .params import METHODS, CA2FLParams


class CA2FL(Strategy):
    params: CA2FLParams

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.buffer: list[Update] = []
        self.cache: dict[int, np.ndarray] = {}  # h_i; absent = 0
        self.cache_sum = np.zeros_like(self.weights, dtype=np.float64)  # Σ_i h_i
        self.flushes = 0

    def _flush(self) -> None:
        k, zero = len(self.buffer), np.zeros_like(self.weights)
        h_bar = (self.cache_sum / self.num_clients).astype(np.float32)
        calibrated = [u.delta - self.cache.get(u.client_id, zero) for u in self.buffer]
        v = h_bar + WeightedMean.combine(calibrated, [1.0 / k] * k)
        self.weights = self.weights + np.float32(self.params.server_lr) * v
        for u in self.buffer:  # arrival order: a client's latest delta is cached last
            old = self.cache.get(u.client_id)
            if old is not None:
                self.cache_sum -= old
            self.cache[u.client_id] = u.delta
            self.cache_sum += u.delta
        self.buffer = []
        self.flushes += 1

    def on_arrival(self, update: Update) -> bool:
        self.buffer.append(update)
        if len(self.buffer) >= self.params.buffer_size:
            self._flush()
            return True
        return False

    def metrics(self) -> dict[str, float]:
        cache_bytes = sum(h.nbytes for h in self.cache.values())
        return {"ca2fl_flushes": float(self.flushes), "ca2fl_cache_bytes": float(cache_bytes)}


METHOD = register(Method.of(METHODS["ca2fl"], strategy=CA2FL))
