"""FedAdam (Reddi et al. 2021, Alg. 2): ``v ← β2 v + (1−β2) Δ²``."""

from __future__ import annotations

import numpy as np

from ..base import Method
from ..registry import register
from .fedopt import FedOpt
from .params import METHODS


class FedAdam(FedOpt):
    def second_moment(self, v: np.ndarray, delta: np.ndarray) -> np.ndarray:
        b2 = self.params.beta2
        return b2 * v + (1 - b2) * delta**2


METHOD = register(Method.of(METHODS["fedadam"], strategy=FedAdam))
