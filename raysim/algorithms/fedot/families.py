"""FedOT's map and potential families (FedOT spec §4), each starting as the identity / zero.

Maps ψ_θ (personal, descent):

- ``affine_diag``: ``ψ(x) = a ⊙ x + b`` with a = 1, b = 0 (§4.1, the companion code's form);
- ``affine_full``: ``ψ(x) = Θ x + θ₀`` on the flat input, Θ = I (§4.1 as printed);
- ``pixel_relu``: ``ψ(x) = ReLU(Θ₂ x + θ₁) + θ₀`` (§4.2), per pixel on the last axis (the RGB
  3-vector of a colour-shifted image, ``psi_scope: pixel``) or on the flat image (``image``);
  Θ₂ = I, θ₁ = θ₀ = 0, which is exactly the identity on inputs ≥ 0.

Potentials φ_i (§2.4): features of the mapped input and a personal head v_i (ascent, zero-sum;
float64, because sync centring keeps the raw heads ṽ_i, whose common drift grows over rounds,
and their differences must stay exact, §3.3):

- ``quad_diag``: ``φ(y) = Σ_d (½ q_d y_d² + l_d y_d)``, head (q, l) (§4.1, §2.6);
- ``quad_full``: ``φ(y) = ½ yᵀ V y + lᵀ y`` with V symmetrised as ½(V + Vᵀ), head (V, l);
- ``nn``: ``φ(y) = v₂ᵀ ReLU(V₁ y + v₀)`` (§4.2): a shared trunk U = (V₁, v₀) (ascent, averaged,
  spectral cap ‖V₁‖₂ ≤ 1) with V₁ ~ N(0, 1/d), and a personal head v₂.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from .params import MapFamily, PotentialFamily


class AffineDiag(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.ones(shape))
        self.b = nn.Parameter(torch.zeros(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.a + self.b

    def identity(self) -> list[torch.Tensor]:
        return [torch.ones_like(self.a), torch.zeros_like(self.b)]


class AffineFull(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        d = math.prod(shape)
        self.shape = shape
        self.theta = nn.Parameter(torch.eye(d))
        self.theta0 = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(len(x), -1)
        return (flat @ self.theta.T + self.theta0).reshape(x.shape)

    def identity(self) -> list[torch.Tensor]:
        return [torch.eye(len(self.theta0)), torch.zeros_like(self.theta0)]


class PixelReLU(nn.Module):
    """ReLU(Θ₂ x + θ₁) + θ₀ per pixel on its colour channels (``pixel``: the last axis of a
    (P, 3) input, the first of a (3, H, W) image) or on the flat input (``image``)."""

    def __init__(self, shape: tuple[int, ...], scope: Literal["pixel", "image"]) -> None:
        super().__init__()
        self.scope = scope
        self.channels_first = scope == "pixel" and len(shape) == 3 and shape[0] == 3
        c = (shape[0] if self.channels_first else shape[-1]) if scope == "pixel" else 0
        c = c or math.prod(shape)
        self.theta2 = nn.Parameter(torch.eye(c))
        self.theta1 = nn.Parameter(torch.zeros(c))
        self.theta0 = nn.Parameter(torch.zeros(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scope == "image":
            z = x.reshape(len(x), -1)
        else:
            z = x.movedim(1, -1) if self.channels_first else x
        out = torch.relu(z @ self.theta2.T + self.theta1) + self.theta0
        if self.channels_first:
            return out.movedim(-1, 1)
        return out.reshape(x.shape)

    def identity(self) -> list[torch.Tensor]:
        c = len(self.theta0)
        return [torch.eye(c), torch.zeros(c), torch.zeros(c)]


class LowRankAffine(nn.Module):
    """``ψ(e) = e + B A e + b`` on the last axis with A = 0 (§9.4: a LoRA whose input and output
    are the same space; the identity at init), B ~ N(0, 1/d), b = 0."""

    def __init__(self, d: int, rank: int) -> None:
        super().__init__()
        self.A = nn.Parameter(torch.zeros(rank, d))
        self.B = nn.Parameter(torch.randn(d, rank) / math.sqrt(d))
        self.b = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (x @ self.A.T) @ self.B.T + self.b

    def identity(self) -> list[torch.Tensor]:
        """A = 0 and b = 0 make ψ the identity whatever B is."""
        return [torch.zeros_like(self.A), self.B.detach(), torch.zeros_like(self.b)]


def build_map(
    family: MapFamily, shape: tuple[int, ...], scope: str = "pixel", rank: int = 4
) -> nn.Module:
    if family == "lowrank_affine":
        return LowRankAffine(shape[-1], rank)
    if family == "affine_diag":
        return AffineDiag(shape)
    if family == "affine_full":
        return AffineFull(shape)
    if scope == "pixel" and not (
        len(shape) == 2 and shape[-1] == 3 or len(shape) == 3 and shape[0] == 3
    ):
        raise ValueError(
            "psi_family pixel_relu with psi_scope pixel needs per-pixel channels (a colour-shifted "
            f"input, data.shift.kind colour); the input has shape {shape}: set psi_scope image"
        )
    return PixelReLU(shape, scope)  # type: ignore[arg-type]


def map_deviation(psi: nn.Module) -> float:
    """‖ψ − id‖: the distance of the map's parameters from the identity's (flat, Euclidean)."""
    with torch.no_grad():
        sq = sum(
            float(((p - i) ** 2).sum())
            for p, i in zip(psi.parameters(), psi.identity(), strict=True)
        )
    return math.sqrt(sq)


def _head(**shapes: tuple[int, ...]) -> nn.ParameterDict:
    return nn.ParameterDict(
        {k: nn.Parameter(torch.zeros(shape, dtype=torch.float64)) for k, shape in shapes.items()}
    )


class QuadDiag(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.head = _head(q=(d,), l=(d,))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        q, lin = (self.head[k].to(y.dtype) for k in ("q", "l"))
        return (0.5 * y * y) @ q + y @ lin

    def curvature(self) -> list[torch.Tensor]:
        return [self.head["q"]]

    def mean_features(self, y: torch.Tensor, weights: torch.Tensor | None = None):
        """∂ mean_B φ / ∂ (q, l): φ is linear in its head, so this is its whole gradient (rows
        weighted by ``weights`` summing to 1 when given)."""
        if weights is None:
            feats = {"q": 0.5 * (y * y).mean(dim=0), "l": y.mean(dim=0)}
        else:
            feats = {"q": 0.5 * (weights @ (y * y)), "l": weights @ y}
        return [feats[k] for k in self.head]  # the head's own (parameter) order


class QuadFull(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.head = _head(V=(d, d), l=(d,))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        v, lin = (self.head[k].to(y.dtype) for k in ("V", "l"))
        sym = 0.5 * (v + v.T)
        return 0.5 * ((y @ sym) * y).sum(dim=1) + y @ lin

    def curvature(self) -> list[torch.Tensor]:
        return [self.head["V"]]

    def mean_features(self, y: torch.Tensor, weights: torch.Tensor | None = None):
        """∂ mean_B φ / ∂ (V, l) = (½ mean y yᵀ, mean y) (symmetric, so the symmetrisation
        passes it through unchanged)."""
        if weights is None:
            feats = {"V": 0.5 * (y.T @ y) / len(y), "l": y.mean(dim=0)}
        else:
            feats = {"V": 0.5 * (y.T * weights) @ y, "l": weights @ y}
        return [feats[k] for k in self.head]  # the head's own (parameter) order


class NNPotential(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.trunk = nn.Linear(d, hidden)
        with torch.no_grad():
            self.trunk.weight.normal_(0.0, 1.0 / math.sqrt(d))
            self.trunk.bias.zero_()
        self.head = _head(v=(hidden,))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.trunk(y)) @ self.head["v"].to(y.dtype)

    def curvature(self) -> list[torch.Tensor]:
        return []

    def mean_features(self, y: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        """None: φ is not linear in (v, U) jointly; the ascent differentiates it."""
        return None


def build_potential(family: PotentialFamily, d: int, hidden: int) -> nn.Module:
    if family == "quad_diag":
        return QuadDiag(d)
    if family == "quad_full":
        return QuadFull(d)
    return NNPotential(d, hidden)


@torch.no_grad()
def cap_spectral(weight: torch.Tensor) -> None:
    """U ← U / max(1, σ_max(U)) in place (Prop. 2's ‖U_l‖₂ ≤ 1; exact SVD, small layers)."""
    sigma = float(torch.linalg.matrix_norm(weight, ord=2))
    if sigma > 1.0:
        weight.div_(sigma)


@torch.no_grad()
def cap_curvature(tensors: list[torch.Tensor], gamma: float, mode: str) -> None:
    """The γ cap of §4.3 on one client's quadratic heads: ``clamp`` each entry (diagonal) or
    eigenvalue (full) to [−γ, γ], or (any other mode: ``rescale_each``) rescale the tensor so
    that its largest magnitude is γ. The pilot's global rescale (one factor for every client,
    ``rescale_all``) is ``FedOTClient.project_together``'s, under exact centring."""
    for t in tensors:
        if t.ndim == 1:
            if mode == "clamp":
                t.clamp_(-gamma, gamma)
            else:
                peak = float(t.abs().max())
                if peak > gamma:
                    t.mul_(gamma / peak)
            continue
        sym = 0.5 * (t + t.T)
        evals, evecs = torch.linalg.eigh(sym)
        peak = float(evals.abs().max())
        if mode == "clamp":
            evals = evals.clamp(-gamma, gamma)
        elif peak > gamma:
            evals = evals * (gamma / peak)
        t.copy_((evecs * evals) @ evecs.T)
