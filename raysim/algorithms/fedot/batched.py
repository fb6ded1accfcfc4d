"""FedOT-GDA's clients vectorised over a group (``workers.execution: batched``).

The spec's pilot ran all clients in one vectorised pass (FedOT spec §9.3). Here a group's
predictors, maps ψ_i, heads v_i and trunks U are stacked on a leading client axis and every
local iteration of ``FedOTClient`` runs once for the whole group:

- k_max ascent steps on (v_i, U): the closed form λ·mean features − 2ρ_v·v for quadratic
  potentials, ``vmap(grad)`` of the regularised dual objective for the NN one, each followed by
  the caps of §4.3 per client (γ on the curvature, ‖U‖₂ ≤ 1, W1's ‖v_i‖ ≤ 1);
- one descent step on (w, θ_i) from ``vmap(grad)`` of the task loss plus λ·mean φ_i(ψ_i(x)).

Sync centring's bookkeeping (v_i = ṽ_i − v̄, the uploaded Δṽ_i, literal_alg1's 1/n) is
``FedOTClient.begin`` / ``finish``'s, written for the stack. Alternating GDA only; every client
of the group must take the same number of equally sized batches (``local.sampling:
independent`` with m ≥ B, as in §9). Results match one-client-at-a-time training to float
rounding (``tests/test_fedot.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.func import functional_call, grad, grad_and_value, vmap

from ...training.batched import unbatchable
from ...training.loop import step_batches
from ..base import ClientContext, Snapshot
from .channels import DUAL_DELTA, PERSONAL_SCALE, VBAR
from .families import NNPotential
from .model import DUAL, MAP, FedOTModel
from .params import FedOTParams


def refusal(params: FedOTParams, ctxs: Sequence[ClientContext]) -> str:
    """Why this group of FedOT clients cannot be vectorised ("" when it can)."""
    first = ctxs[0]
    module: FedOTModel = first.model.module
    if params.gda_mode != "alternating":
        return "only alternating GDA is vectorised"
    if module.on_embeddings:
        return "maps on token embeddings are not vectorised"
    cfg = first.config
    sizes = {first.task.num_examples(c.data) for c in ctxs}
    even = len(sizes) == 1 or (cfg.sampling == "independent" and min(sizes) >= cfg.batch_size)
    if not even:
        return "the clients' batches differ in size: set local.sampling independent with m ≥ B"
    return unbatchable(first.model, first.task, [c.config for c in ctxs], personal=True)


def _sub(params: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {n[len(prefix) :]: t for n, t in params.items() if n.startswith(prefix)}


class GroupRound:
    """One round of a group of FedOT clients, stacked."""

    def __init__(
        self,
        params: FedOTParams,
        model: Any,
        ctxs: Sequence[ClientContext],
        starts: Sequence[Snapshot],
    ) -> None:
        self.p, self.ctxs, self.k = params, ctxs, len(ctxs)
        self.module: FedOTModel = model.module
        names = {id(q): n for n, q in self.module.named_parameters()}
        self.groups = {
            g.name: [names[id(q)] for q in model.group_parameters(g.name)] for g in model.groups
        }
        self.t = {
            n: torch.stack([s[g][j] for s in starts]).detach().clone()
            for g, group in self.groups.items()
            for j, n in enumerate(group)
        }
        cfg = ctxs[0].config
        self.lr = cfg.lr
        self.lr_map = cfg.lr if params.lr_map is None else params.lr_map
        self.lr_up = cfg.lr if params.lr_ascent is None else params.lr_ascent
        self.heads = self.groups[DUAL]
        self.maps = self.groups[MAP]
        self.trunk = [
            n for n in self.groups[model.groups[0].name] if n.startswith("potential.trunk.")
        ]
        self.predictor = [
            n for n in self.groups[model.groups[0].name] if n.startswith("predictor.")
        ]
        # begin: the effective heads v_i = ṽ_i − v̄ (the same v̄ for the whole group)
        self.raw = self.flat_heads()
        vbar = ctxs[0].downlink.get(VBAR)
        if vbar is not None:
            # a copy: on Ray the downlink's array is the object store's, read-only
            self.assign_heads(self.raw - torch.tensor(vbar, dtype=torch.float64))
        self.v_start = self.flat_heads()
        self.theta_start = {n: self.t[n].clone() for n in self.maps}
        self.steps = [
            list(step_batches(c.task.num_examples(c.data), cfg, c.generator)) for c in ctxs
        ]
        self.losses: list[torch.Tensor] = []
        self.penalty = torch.full((self.k,), float("nan"))

    # ------------------------------------------------------------------ heads
    def flat_heads(self) -> torch.Tensor:
        return torch.cat([self.t[n].reshape(self.k, -1).double() for n in self.heads], dim=1)

    def assign_heads(self, flat: torch.Tensor) -> None:
        offset = 0
        for n in self.heads:
            size = math.prod(self.t[n].shape[1:])
            self.t[n] = flat[:, offset : offset + size].reshape(self.t[n].shape).to(self.t[n].dtype)
            offset += size

    # ------------------------------------------------------------------ pieces
    def mapped(self, x: torch.Tensor) -> torch.Tensor:
        theta = {n: self.t[n] for n in self.maps}
        return vmap(lambda th, xi: functional_call(self.module.psi, _sub(th, "psi."), (xi,)))(
            theta, x
        )

    def potential(self, params: dict, y: torch.Tensor) -> torch.Tensor:
        """φ per sample of one client's mapped batch."""
        return functional_call(
            self.module.potential, _sub(params, "potential."), (y.reshape(len(y), -1),)
        )

    def regulariser(self, params: dict) -> torch.Tensor:
        rho_v, rho_u = self.p.rho
        out = torch.zeros((), dtype=torch.float64)
        if rho_v:
            out = out + rho_v * sum((params[n] ** 2).sum() for n in self.heads)
        if rho_u and self.trunk:
            out = out + rho_u * sum((params[n] ** 2).sum() for n in self.trunk)
        return out

    # ------------------------------------------------------------------ ascent
    def ascent(self, x: torch.Tensor) -> None:
        p = self.p
        with torch.no_grad():
            y = self.mapped(x)
            flat = y.reshape(self.k, y.shape[1], -1)
            feats = None
            if not isinstance(self.module.potential, NNPotential):  # linear in its head
                feats = vmap(lambda yi: tuple(self.module.potential.mean_features(yi)))(flat)
        names = self.heads + self.trunk
        lam, rho_v = p.lam, p.rho[0]
        for _ in range(p.ascent_steps):
            if feats is not None:
                grads = [
                    lam * f - 2.0 * rho_v * self.t[n]
                    for n, f in zip(self.heads, feats, strict=True)
                ]
            else:
                if not lam and not any(p.rho):
                    return

                def objective(params: dict, yi: torch.Tensor) -> torch.Tensor:
                    value = -self.regulariser(params)
                    if lam:
                        value = value + lam * self.potential(params, yi).mean()
                    return value

                got = vmap(grad(objective))({n: self.t[n] for n in names}, y)
                grads = [got[n] for n in names]
            with torch.no_grad():
                for n, g in zip(names, grads, strict=False):
                    self.t[n] = self.t[n] + self.lr_up * g.to(self.t[n].dtype)
            self.project()

    def project(self) -> None:
        """§4.3's caps per client, as ``FedOTClient.project`` applies them to one client."""
        p = self.p
        with torch.no_grad():
            if p.gamma_cap != "none":
                for n in self.heads:
                    if n.rsplit(".", 1)[-1] in ("q", "V"):
                        self.t[n] = _cap_curvature(self.t[n], p.gamma, p.gamma_cap)
            if p.trunk_cap:
                for n in self.trunk:
                    if n.endswith("weight"):
                        sigma = torch.linalg.matrix_norm(self.t[n], ord=2)
                        scale = torch.where(sigma > 1.0, sigma, torch.ones_like(sigma))
                        self.t[n] = self.t[n] / scale.view(-1, 1, 1)
            if p.cost == "w1_lip":
                norm = self.flat_heads().norm(dim=1)
                scale = torch.where(norm > 1.0, norm, torch.ones_like(norm))
                self.assign_heads(self.flat_heads() / scale[:, None])

    # ------------------------------------------------------------------ descent
    def descend(self, x: torch.Tensor, y: torch.Tensor) -> None:
        lam, task = self.p.lam, self.ctxs[0].task
        trained = self.predictor + self.maps
        fixed_names = self.heads + self.trunk

        def objective(params: dict, fixed: dict, xi: torch.Tensor, yi: torch.Tensor):
            mapped = functional_call(self.module.psi, _sub(params, "psi."), (xi,))
            logits = functional_call(self.module.predictor, _sub(params, "predictor."), (mapped,))
            loss = task.loss(lambda _: logits, (xi, yi))
            dual = lam * self.potential(fixed, mapped).mean() if lam else loss.new_zeros(())
            return loss + dual, (loss, dual)

        grads, (_, (loss, dual)) = vmap(grad_and_value(objective, has_aux=True))(
            {n: self.t[n] for n in trained}, {n: self.t[n] for n in fixed_names}, x, y
        )
        with torch.no_grad():
            for n in self.predictor:
                self.t[n] = self.t[n] - self.lr * grads[n]
            for n in self.maps:
                self.t[n] = self.t[n] - self.lr_map * grads[n]
        self.losses.append(loss.detach())
        self.penalty = dual.detach() if lam else torch.full((self.k,), float("nan"))

    # ------------------------------------------------------------------ the round
    def run(self) -> tuple[list[Snapshot], list[dict[str, float]]]:
        data = [c.data for c in self.ctxs]
        for t in range(len(self.steps[0])):
            x = torch.stack([d[0][s[t]] for d, s in zip(data, self.steps, strict=True)])
            y = torch.stack([d[1][s[t]] for d, s in zip(data, self.steps, strict=True)])
            self.ascent(x)
            self.descend(x, y)
        return self.finish()

    def finish(self) -> tuple[list[Snapshot], list[dict[str, float]]]:
        dual_norm = self.flat_heads().norm(dim=1)
        delta = self.flat_heads() - self.v_start
        scale = self.ctxs[0].downlink.get(PERSONAL_SCALE)
        if scale is not None:  # literal_alg1: the personal deltas are divided by n (§3.2)
            s = float(scale[0])
            delta = delta * s
            for n in self.maps:
                self.t[n] = self.theta_start[n] + (self.t[n] - self.theta_start[n]) * s
        self.assign_heads(self.raw + delta)
        identity = self.module.psi.identity()
        deviation = torch.sqrt(
            sum(
                ((self.t[n] - i) ** 2).reshape(self.k, -1).sum(dim=1)
                for n, i in zip(self.maps, identity, strict=True)
            )
        )
        losses = torch.stack(self.losses, dim=1) if self.losses else None
        out, metrics = [], []
        for i, ctx in enumerate(self.ctxs):
            ctx.upload(DUAL_DELTA, delta[i].numpy().copy())
            out.append(
                {
                    g: [self.t[n][i].detach().clone() for n in names]
                    for g, names in self.groups.items()
                }
            )
            metrics.append(
                {
                    "train_loss": float(losses[i].mean()) if losses is not None else float("nan"),
                    "local_steps": float(len(self.losses)),
                    "dual_penalty": float(self.penalty[i]),
                    "dual_norm": float(dual_norm[i]),
                    "map_deviation": float(deviation[i]),
                }
            )
        return out, metrics


def _cap_curvature(t: torch.Tensor, gamma: float, mode: str) -> torch.Tensor:
    """``families.cap_curvature`` for each client of a stack (k, d) or (k, d, d)."""
    if t.ndim == 2:
        if mode == "clamp":
            return t.clamp(-gamma, gamma)
        peak = t.abs().amax(dim=1, keepdim=True)
        return torch.where(peak > gamma, t * (gamma / peak), t)
    sym = 0.5 * (t + t.transpose(1, 2))
    evals, evecs = torch.linalg.eigh(sym)
    peak = evals.abs().amax(dim=1, keepdim=True)
    if mode == "clamp":
        evals = evals.clamp(-gamma, gamma)
    else:
        evals = torch.where(peak > gamma, evals * (gamma / peak), evals)
    return (evecs * evals.unsqueeze(1)) @ evecs.transpose(1, 2)
