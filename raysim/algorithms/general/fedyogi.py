"""FedYogi (Reddi et al. 2021, Alg. 2): ``v ← v − (1−β2) Δ² sign(v − Δ²)``."""

from __future__ import annotations

import numpy as np

from ..base import Method
from ..registry import register
from .fedopt import FedOpt
from .params import METHODS


class FedYogi(FedOpt):
    def second_moment(self, v: np.ndarray, delta: np.ndarray) -> np.ndarray:
        sq = delta**2
        return v - (1 - self.params.beta2) * sq * np.sign(v - sq)


METHOD = register(Method.of(METHODS["fedyogi"], strategy=FedYogi))
