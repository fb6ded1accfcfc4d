"""The resident model of a FedOT run: a personal map, the shared predictor and the potentials.

``FedOTModel(x) = predictor(ψ(x))`` (the inference rule of fedot.md §3.6); the potential is used
only in training, on the mapped inputs of the last forward pass (``mapped``). Its parameters fall
into the method's groups by name (§3.2, §8.1):

- ``global`` (shared, averaged): ``predictor.*``, and for the ``nn`` potential ``potential.trunk.*``
  (trained by ascent, averaged, then projected by the server);
- ``map`` (personal, descent): ``psi.*``, never sent;
- ``dual`` (ascent): ``potential.head.*``, the client's raw head ṽ_i (§3.3), never sent.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ...models.layout import ParamGroup
from .families import build_map, build_potential

GLOBAL, MAP, DUAL = "global", "map", "dual"
GROUPS = (
    ParamGroup(GLOBAL, "shared"),
    ParamGroup(MAP, "personal", r"^psi\."),
    ParamGroup(DUAL, "ascent", r"^potential\.head\."),
)
TRUNK_PREFIX = "potential.trunk."


class FedOTModel(nn.Module):
    """``predictor ∘ ψ`` with the potential alongside; remembers the last mapped batch."""

    def __init__(self, predictor: nn.Module, psi: nn.Module, potential: nn.Module) -> None:
        super().__init__()
        self.psi = psi
        self.predictor = predictor
        self.potential = potential
        self.mapped: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.psi(x)
        self.mapped = y
        return self.predictor(y)

    def potential_values(self, y: torch.Tensor) -> torch.Tensor:
        """φ_i(y) per sample, on the flattened mapped inputs."""
        return self.potential(y.reshape(len(y), -1))


def wrap(module: nn.Module, spec: Any, params: Any) -> FedOTModel:
    """``Method.wrap_model`` for FedOT: the built predictor inside a map and a potential."""
    shape = tuple(spec.feature_shape)
    psi = build_map(params.psi_family, shape, params.psi_scope)
    potential = build_potential(params.potential, math.prod(shape), params.hidden)
    return FedOTModel(module, psi, potential)
