"""``algorithm: {name: fedbaf, base: fedprox, base_params: {mu: 0.01}, foundation: ..., psi: 1}``:
FedBaF over a base method in one config entry (fedbaf.md §2.6).

The base keeps its own ``ClientUpdate`` (the client half is the base's) and its own server update,
which yields ``w'``; the FedBaF mixer then turns ``w'`` into the next broadcast, and the base
builds on the mixed model (FedAdam's moments still see client deltas only). With a FedProx base,
``fedprox_server_mode: paper_damped`` (the default, §2.6's only consistent reading of the paper's
changed line 8) puts ``w' = (1−μ)·w̄ + μ·w_t`` (the ``damp`` mixer) before the FedBaF mix;
``standard`` keeps the plain weighted mean of Li et al. 2020. The same mix composes on any other
base through ``hooks.server: [{name: fedbaf, ...}]``.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from ..base import ClientAlgorithm, ClientContext, Method, Needs
from ..general.mixers import Damp, DampParams
from ..hooks import ComposedStrategy
from ..registry import get_method, register
from .mixer import FedBaF, FedBaFParams


class FedBaFMethodParams(FedBaFParams):
    base: Literal["fedavg", "fedprox", "fedadam"] = Field(
        "fedavg", description="the bases §2.6 names; any other composes through hooks.server"
    )
    base_params: dict[str, Any] = Field(
        default_factory=dict, description="the base method's own parameters, e.g. {mu: 0.01}"
    )
    fedprox_server_mode: Literal["paper_damped", "standard"] = Field(
        "paper_damped", description="FedProx's server line 8 (§2.6)"
    )

    @model_validator(mode="after")
    def _check_base(self) -> FedBaFMethodParams:
        try:
            get_method(self.base).params(**self.base_params)
        except ValueError as e:
            raise ValueError(f"fedbaf base_params for {self.base!r}: {e}") from None
        return self

    def base_method_params(self) -> Any:
        return get_method(self.base).params(**self.base_params)


class FedBaFStrategy(ComposedStrategy):
    """The base's strategy, then (FedProx's damping,) then the FedBaF mix."""

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


METHOD = register(
    Method(
        name="fedbaf",
        strategy=FedBaFStrategy,
        params=FedBaFMethodParams,
        client=FedBaFClient,
        reference="FedBaF (Park et al. 2024) over FedAvg, FedProx or FedAdam; fedbaf.md §2",
        needs=Needs(example="examples/fedbaf/mini.yaml"),
    )
)
