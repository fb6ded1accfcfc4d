"""FedOT-GDA (FedOT spec §3, Algorithm 1) registered as ``fedot``.

A personal map ψ_i in front of the shared predictor, zero-sum dual potentials, local alternating
descent–ascent and FedAvg-style averaging of the shared parts only (§3.2). A known client is
evaluated as f_w(ψ_i(x)) with its own map (§3.6); a new one with the identity map. Switches, with
the spec section that fixes each default: ``params.FedOTParams``.
"""

from __future__ import annotations

from ..base import Method
from ..registry import register
from .client import FedOTClient
from .model import GROUPS, MAP, wrap
from .params import METHODS
from .server import FedOTStrategy

METHOD = register(
    Method.of(
        METHODS["fedot"],
        strategy=FedOTStrategy,
        client=FedOTClient,
        groups=GROUPS,
        evaluate_with=MAP,
        wrap_model=wrap,
    )
)
