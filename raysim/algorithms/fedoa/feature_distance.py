"""Feature pooling and feature distances D(E, G) of FedOA spec §2.4–2.5 (FedOA's and FedSDR's)."""

from __future__ import annotations

import torch

from .params import Distance, Pool

EPS = 1e-8
_TINY = 1e-24


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last non-pad position per row, whatever the padding side."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.long() * positions).argmax(dim=1)


def pool_features(
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor | None = None,
    how: Pool = "last",
) -> torch.Tensor:
    """(B, L, d) hidden states → (B, d) features, or (N, d) non-pad positions for ``token``.

    ``last`` (default, the authors' code): the last real token; ``mean``: mask-weighted mean;
    ``response_mean``: mean over labelled (response) positions; ``token``: every non-pad position.
    """
    if how == "last":
        idx = last_token_index(attention_mask)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]
    if how == "token":
        return hidden[attention_mask.bool()]
    if how == "response_mean":
        if labels is None:
            raise ValueError("feature_pool='response_mean' needs labels")
        mask = (labels != -100) & attention_mask.bool()
    else:
        mask = attention_mask.bool()
    w = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * w).sum(1) / w.sum(1).clamp_min(1.0)


def _safe_norm(x: torch.Tensor, dim=None) -> torch.Tensor:
    """‖x‖₂ with a finite (zero) gradient at x = 0 (FedOA spec §2.5, invariant I7)."""
    sq = (x * x).sum() if dim is None else (x * x).sum(dim)
    return torch.sqrt(sq.clamp_min(_TINY))


def _cosine_rows(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return (e * g).sum(1) / (_safe_norm(e, 1) * _safe_norm(g, 1) + EPS)


def feature_distance(e: torch.Tensor, g: torch.Tensor, kind: Distance = "l2") -> torch.Tensor:
    """D(E, G) for (B, d) student features E and teacher features G (FedOA spec §2.5).

    ``l2`` (default, code form): ‖E − G‖_F over the micro-batch, un-squared, not averaged;
    ``l2_squared`` (theory form); ``l2_mean``: mean per-example ‖e_b − g_b‖; ``mse``;
    ``cosine``: 1 − mean cos; ``pearson``: 1 − mean correlation across features; ``l1``.
    """
    diff = e - g
    if kind == "l2":
        return _safe_norm(diff)
    if kind == "l2_squared":
        return (diff * diff).sum()
    if kind == "l2_mean":
        return _safe_norm(diff, 1).mean()
    if kind == "mse":
        return (diff * diff).mean()
    if kind == "l1":
        return diff.abs().sum() / e.shape[0]
    if kind == "cosine":
        return 1 - _cosine_rows(e, g).mean()
    if kind == "pearson":
        return 1 - _cosine_rows(e - e.mean(1, keepdim=True), g - g.mean(1, keepdim=True)).mean()
    raise ValueError(f"unknown feature distance {kind!r}")
