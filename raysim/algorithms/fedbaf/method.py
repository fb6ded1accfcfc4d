"""``algorithm: {name: fedbaf, base: fedprox, base_params: {mu: 0.01}, foundation: ..., psi: 1}``:
FedBaF over a base method in one config entry (FedBaF spec §2.6).

The base keeps its own ``ClientUpdate`` (the client half is the base's) and its own server update,
which yields ``w'``; the FedBaF mixer then turns ``w'`` into the next broadcast, and the base
builds on the mixed model (FedAdam's moments still see client deltas only). With a FedProx base,
``fedprox_server_mode: paper_damped`` (the default, §2.6's only consistent reading of the paper's
changed line 8) puts ``w' = (1−μ)·w̄ + μ·w_t`` (the ``damp`` mixer) before the FedBaF mix;
``standard`` keeps the plain weighted mean of Li et al. 2020. The same mix composes on any other
base through ``hooks.server: [{name: fedbaf, ...}]``.
"""

from __future__ import annotations

import numpy as np

from ..base import ClientAlgorithm, ClientContext, Method
from ..general.mixers import Damp, DampParams
from ..hooks import ComposedStrategy
from ..registry import get_method, register
from .mixer import FedBaF, FedBaFParams
from .params import METHODS, FedBaFMethodParams


class FedBaFStrategy(ComposedStrategy):
    """The base's strategy, then (FedProx's damping,) then the FedBaF mix."""

    #: its bases (FedAvg, FedProx, FedAdam) sum; the mix reads the aggregate, never an update
    sums_updates = True

    def __init__(
        self, params: FedBaFMethodParams, initial_weights: np.ndarray, num_clients: int
    ) -> None:
        base_params = params.base_method_params()
        base = get_method(params.base).strategy(base_params, initial_weights, num_clients)
        mixers = []
        if params.base == "fedprox" and params.fedprox_server_mode == "paper_damped":
            mixers.append(Damp(DampParams(mu=base_params.mu)))
        fedbaf = {k: getattr(params, k) for k in FedBaFParams.model_fields}
        mixers.append(FedBaF(FedBaFParams(**fedbaf)))
        super().__init__(base, mixers)
        self.fedbaf_params = params

    @property
    def params(self) -> FedBaFMethodParams:
        return self.fedbaf_params


class FedBaFClient(ClientAlgorithm):
    """The base method's client half (FedProx's proximal term, or plain training)."""

    def __init__(self, params: FedBaFMethodParams) -> None:
        super().__init__(params)
        self.inner = get_method(params.base).client(params.base_method_params())

    def train(self, ctx: ClientContext) -> dict[str, float]:
        return self.inner.train(ctx)

    def unbatchable(self, ctxs):
        return self.inner.unbatchable(ctxs)

    def train_batched(self, model, ctxs, starts):
        """Batched execution as the base method's client does it."""
        return self.inner.train_batched(model, ctxs, starts)


METHOD = register(Method.of(METHODS["fedbaf"], strategy=FedBaFStrategy, client=FedBaFClient))
