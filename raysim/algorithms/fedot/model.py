"""The resident model of a FedOT run: a personal map, the shared predictor and the potentials.

``FedOTModel(x) = predictor(ψ(x))`` (the inference rule of FedOT spec §3.6); the potential is used
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
    """``predictor ∘ ψ`` with the potential alongside; remembers the last mapped batch.

    A predictor that reads token ids and exposes its embedding step (``embed``,
    ``from_embeddings``: ``lm_classifier``) is mapped on its token embeddings instead (§9.4): ψ_i
    acts on each token's embedding, and the potential's value for a sample is the mean over its
    real tokens (padding masked out)."""

    def __init__(
        self,
        predictor: nn.Module,
        psi: nn.Module,
        potential: nn.Module,
        potential_scale: float = 1.0,
    ) -> None:
        super().__init__()
        self.psi = psi
        self.predictor = predictor
        self.potential = potential
        self.on_embeddings = hasattr(predictor, "from_embeddings")
        #: token embeddings enter ψ multiplied by it and leave divided by it, so the map and the
        #: potential work in those units (``FedOTParams.potential_input``)
        self.potential_scale = potential_scale
        self.mapped: torch.Tensor | None = None
        self.mask: torch.Tensor | None = None

    def map(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(ψ_i of the inputs or of their token embeddings, the real-token mask or None)."""
        if self.on_embeddings:
            e = self.predictor.embed(x)
            if self.potential_scale != 1.0:
                e = e * self.potential_scale
            return self.psi(e), x != getattr(self.predictor, "pad_id", 0)
        return self.psi(x), None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, mask = self.map(x)
        self.mapped, self.mask = y, mask
        if mask is not None:
            if self.potential_scale != 1.0:
                y = y / self.potential_scale
            return self.predictor.from_embeddings(y, mask)
        return self.predictor(y)

    def potential_values(self, y: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """φ_i per sample: on the flattened mapped input, or the mean over real tokens."""
        if mask is None:
            return self.potential(y.reshape(len(y), -1))
        tokens = self.potential(y.reshape(-1, y.shape[-1])).reshape(mask.shape)
        weights = mask.to(tokens.dtype)
        return (tokens * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)

    def mean_features(self, y: torch.Tensor, mask: torch.Tensor | None = None):
        """The batch mean of the potential's features (None for the nn potential): the rows of
        the flattened input, or every real token weighted 1/(its sample's tokens · N)."""
        if mask is None:
            return self.potential.mean_features(y.reshape(len(y), -1))
        weights = mask.to(y.dtype)
        weights = weights / weights.sum(dim=1, keepdim=True).clamp(min=1.0) / len(y)
        return self.potential.mean_features(y.reshape(-1, y.shape[-1]), weights.reshape(-1))


def potential_scale(module: nn.Module, params: Any) -> float:
    """1 (``raw``), or 1/σ_e with σ_e the std of the predictor's token-embedding table
    (``embedding_std``: the §9.4 benchmark's own unit; the map and the potentials then work on
    e/σ_e, so the moments they match are O(1) and the map's step sizes mean the same whatever
    the table's scale)."""
    if params.potential_input == "raw":
        return 1.0
    table = getattr(module, "input_embeddings", None)
    if table is None:
        raise ValueError(
            "algorithm.potential_input embedding_std standardises token embeddings: it needs a "
            "model with input embeddings (model.name lm_classifier)"
        )
    return 1.0 / float(table().weight.detach().float().std())


def wrap(module: nn.Module, spec: Any, params: Any) -> FedOTModel:
    """``Method.wrap_model`` for FedOT: the built predictor inside a map and a potential (on
    the token embeddings of a predictor that exposes them, §9.4)."""
    dim = getattr(module, "embedding_dim", None)
    shape = (dim,) if dim is not None else tuple(spec.feature_shape)
    psi = build_map(params.psi_family, shape, params.psi_scope, params.psi_rank)
    potential = build_potential(params.potential, math.prod(shape), params.hidden)
    return FedOTModel(module, psi, potential, potential_scale(module, params))
