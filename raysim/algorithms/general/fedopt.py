"""Adaptive server optimisers (Reddi et al. 2021, "Adaptive Federated Optimization").

The round's sample-weighted mean delta Δ is treated as a pseudo-gradient:
``m ← β1 m + (1−β1) Δ``; second moment by the subclass rule; ``ω ← ω + η m / (√v + τ)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .fedavg import RoundBuffer
from .params import FedOptParams


class FedOpt(RoundBuffer):
    """Shared first-moment and update logic; subclasses define ``second_moment``."""

    params: FedOptParams

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.m = np.zeros_like(self.weights)
        self.v = np.full_like(self.weights, self.params.tau**2)

    def second_moment(self, v: np.ndarray, delta: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def on_round_end(self, round_index: int) -> bool:
        delta = self.round_delta()
        self.pending = []
        if delta is None:
            return True
        p = self.params
        self.m = (p.beta1 * self.m + (1 - p.beta1) * delta).astype(np.float32)
        self.v = self.second_moment(self.v, delta).astype(np.float32)
        step = p.server_lr * self.m / (np.sqrt(self.v) + p.tau)
        self.weights = (self.weights + step).astype(np.float32)
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"weights": self.weights, "m": self.m, "v": self.v}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.m, self.v = np.array(state["m"]), np.array(state["v"])
