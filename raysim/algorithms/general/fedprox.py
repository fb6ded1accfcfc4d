"""FedProx (Li et al. 2020): FedAvg aggregation, local loss + (μ/2)‖w − w_global‖²."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...training.backends import PenaltyFn
from ...training.penalties import Proximal
from ..base import ClientAlgorithm, Method
from ..registry import register
from .fedavg import FedAvg
from .params import METHODS, FedProxParams


class FedProxClient(ClientAlgorithm):
    """Adds the proximal term to every local step; anchored at the downloaded model."""

    params: FedProxParams

    def penalty(self, global_params: Sequence[torch.Tensor]) -> PenaltyFn | None:
        mu = self.params.mu
        if mu == 0:
            return None

        return Proximal(mu, global_params)


METHOD = register(Method.of(METHODS["fedprox"], strategy=FedAvg, client=FedProxClient))
