"""Built-in post-aggregation mixers (``hooks.server``); each composes on any base strategy.

- ``damp``: ``w ← (1−μ)·w_agg + μ·w_prev``, server-side damping towards the previous model; with a
  FedAvg base this is FedBaF spec §2.6's ``paper_damped`` reading of FedProx's changed line 8.
- ``clip_step``: bound the server step, ``w ← w_prev + min(1, C/‖w_agg − w_prev‖)(w_agg − w_prev)``
  (norm bounding of the aggregate, a standard robustness defence).
"""

from __future__ import annotations

import numpy as np

from ..hooks import Mixer
from ..registry import MIXERS, Hook
from .params import HOOKS, ClipStepParams, DampParams


class Damp(Mixer):
    params: DampParams

    def mix(self, round_index: int, previous: np.ndarray, aggregated: np.ndarray) -> np.ndarray:
        mu = np.float32(self.params.mu)
        return (np.float32(1) - mu) * aggregated + mu * previous


class ClipStep(Mixer):
    params: ClipStepParams

    def __init__(self, params: ClipStepParams) -> None:
        super().__init__(params)
        self.clipped = 0

    def mix(self, round_index: int, previous: np.ndarray, aggregated: np.ndarray) -> np.ndarray:
        step = aggregated - previous
        norm = float(np.linalg.norm(step.astype(np.float64)))
        if norm <= self.params.max_norm:
            return aggregated
        self.clipped += 1
        return previous + np.float32(self.params.max_norm / norm) * step

    def metrics(self) -> dict[str, float]:
        return {"clip_step_clipped": float(self.clipped)}


MIXERS.register(Hook.of(HOOKS["damp"], Damp))
MIXERS.register(Hook.of(HOOKS["clip_step"], ClipStep))
