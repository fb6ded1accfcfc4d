"""Penalties a local step adds to the task loss, in the form batched training can stack."""

from __future__ import annotations

from collections.abc import Sequence

import torch


class Proximal:
    """(weight/2)·Σ‖p − c‖² about a fixed ``centre`` (FedProx's proximal term, Ditto's).

    Called on one client's tensors it is the scalar a sequential step adds; ``stacked`` takes
    tensors with a leading client axis and gives each client's value, so batched training
    (``raysim.training.batched``) computes it without ``vmap``."""

    def __init__(self, weight: float, centre: Sequence[torch.Tensor]) -> None:
        self.weight = weight
        self.centre = list(centre)

    def __call__(self, params: Sequence[torch.Tensor]) -> torch.Tensor:
        terms = (((p - c) ** 2).sum() for p, c in zip(params, self.centre, strict=False))
        return 0.5 * self.weight * sum(terms)

    def stacked(self, params: Sequence[torch.Tensor]) -> torch.Tensor:
        """Each client's value, shape (k,), for stacks (k, ...) of its tensors."""
        pairs = zip(params, self.centre, strict=False)
        terms = ((p - c).square().flatten(1).sum(1) for p, c in pairs)
        return 0.5 * self.weight * sum(terms)

    @torch.no_grad()
    def stacked_with_gradient(
        self, params: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``stacked``'s values (no graph) and each tensor's gradient weight·(p − c), written
        out rather than through autograd (a step of a small model costs half as much)."""
        diffs = [p - c for p, c in zip(params, self.centre, strict=False)]
        values = 0.5 * self.weight * sum(d.square().flatten(1).sum(1) for d in diffs)
        return values, [d.mul_(self.weight) for d in diffs]
