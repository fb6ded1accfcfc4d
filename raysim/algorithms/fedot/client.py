"""FedOT-GDA's client (fedot.md §3.5): local descent–ascent on the regularised objective.

Per local iteration, on one batch B (the client's step stream, ``step_batches``):

    L̂_i = mean_B [ ℓ(f_w(ψ_i(x)), y) + λ φ_i(ψ_i(x)) ] − ρ_v ‖v_i‖² − ρ_U ‖U‖_F²

``alternating`` (the experiments, §3.4): ``k_max`` ascent steps on (v_i, U) at η2, then one
descent step on (w, θ_i) at (η1, η_θ), all on the same batch; ``simultaneous`` (Alg. 1): both
gradients at the same point, then both steps. Plain SGD throughout (§6.4). The caps of §4.3 follow
every ascent step. The head the client trains is v_i = ṽ_i − v̄ (sync centring, §3.3): it loads
its raw ṽ_i, subtracts the server's v̄ (downlink), trains, uploads Δṽ_i and keeps ṽ_i + Δṽ_i.
With λ = 0 the descent loss is exactly the task loss, so with a frozen identity map the predictor
follows FedAvg's trajectory bit for bit (invariant 1).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ...training.loop import step_batches, training_task
from ..base import ClientAlgorithm, ClientContext
from .families import cap_curvature, cap_spectral, map_deviation
from .model import DUAL, MAP, TRUNK_PREFIX, FedOTModel
from .params import FedOTParams

#: downlink names: the server's head mean v̄ and the personal-step scale (1/n, literal_alg1)
VBAR, PERSONAL_SCALE = "fedot/vbar", "fedot/personal_scale"
#: uplink name: Δṽ_i, the round's change of the client's head
DUAL_DELTA = "fedot/dual_delta"


def sgd(params: list[torch.Tensor], grads: tuple[torch.Tensor, ...], lr: float) -> None:
    """p ← p − lr·g in place (torch.optim.SGD's own update, without momentum)."""
    with torch.no_grad():
        for q, g in zip(params, grads, strict=True):
            q.add_(g, alpha=-lr)


def flat64(tensors: list[torch.Tensor]) -> np.ndarray:
    """The heads as one float64 vector."""
    with torch.no_grad():
        return torch.cat([t.detach().reshape(-1).double() for t in tensors]).numpy().copy()


def assign64(tensors: list[torch.Tensor], flat: np.ndarray) -> None:
    src, offset = torch.from_numpy(np.asarray(flat, dtype=np.float64)), 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(src[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def sq_norm(tensors: list[torch.Tensor]) -> torch.Tensor | float:
    return sum((t * t).sum() for t in tensors) if tensors else 0.0


def mapped_features(model: FedOTModel, x: torch.Tensor):
    """(ψ_i of the batch, its real-token mask or None, the potential's mean features or None),
    without gradients."""
    with torch.no_grad():
        y, mask = model.map(x)
        return y, mask, model.mean_features(y, mask)


class FedOTClient(ClientAlgorithm):
    params: FedOTParams

    def parts(self, model: FedOTModel, ctx: ClientContext):
        """(predictor w, map θ_i, head v_i, trunk U) parameter lists of the resident model."""
        trunk = [q for n, q in model.named_parameters() if n.startswith(TRUNK_PREFIX)]
        w = [q for q in model.predictor.parameters() if q.requires_grad]
        return w, ctx.model.group_parameters(MAP), ctx.model.group_parameters(DUAL), trunk

    def dual_term(
        self, model: FedOTModel, y: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """λ · mean_B φ_i(y)."""
        return self.params.lam * model.potential_values(y, mask).mean()

    def regulariser(self, heads, trunk) -> torch.Tensor | float:
        rho_v, rho_u = self.params.rho
        out = 0.0
        if rho_v:
            out = out + rho_v * sq_norm(heads)
        if rho_u and trunk:
            out = out + rho_u * sq_norm(trunk)
        return out

    def project(self, model: FedOTModel, heads, trunk) -> None:
        """§4.3's caps after an ascent step: γ on quadratic heads, ‖U_l‖₂ ≤ 1, W1's ‖v_i‖ ≤ 1."""
        p = self.params
        if p.gamma_cap != "none":
            cap_curvature(model.potential.curvature(), p.gamma, p.gamma_cap)
        if p.trunk_cap and trunk:
            cap_spectral(model.potential.trunk.weight)
        if p.cost == "w1_lip":
            norm = math.sqrt(float(sq_norm(heads)))
            if norm > 1.0:
                with torch.no_grad():
                    for t in heads:
                        t.div_(norm)

    def ascent_gradient(self, model: FedOTModel, y, mask, features, heads, trunk):
        """∇ of L̂_i in (v_i, U) at the current point, for mapped inputs ``y`` (flat) whose
        ``features`` the potential gave (None for the nn one); None when nothing moves (λ = 0
        and no regulariser). A potential linear in its head has the closed form
        ∇_v = λ·mean_B features − 2ρ_v·v."""
        lam, rho_v = self.params.lam, self.params.rho[0]
        if features is not None:
            with torch.no_grad():
                return [lam * f - 2.0 * rho_v * v for v, f in zip(heads, features, strict=True)]
        objective = -self.regulariser(heads, trunk)
        if lam:
            objective = objective + self.dual_term(model, y, mask)
        if not isinstance(objective, torch.Tensor) or not objective.requires_grad:
            return None
        params = heads + trunk
        grads = torch.autograd.grad(objective, params, allow_unused=True)
        return [torch.zeros_like(q) if g is None else g for q, g in zip(params, grads, strict=True)]

    def ascent(self, model: FedOTModel, x: torch.Tensor, heads, trunk, lr: float) -> None:
        """k_max ascent steps on (v_i, U) with θ_i fixed (ψ_i(x) is computed once)."""
        y, mask, features = mapped_features(model, x)
        for _ in range(self.params.ascent_steps):
            grads = self.ascent_gradient(model, y, mask, features, heads, trunk)
            if grads is None:
                return
            sgd(heads + trunk, grads, -lr)
            self.project(model, heads, trunk)

    def descend(self, model: FedOTModel, task, batch, w, theta, lr: float, lr_map: float):
        """One descent step on (w, θ_i): the task loss plus λ·mean φ_i(ψ_i(x)) (the task loss
        alone when λ = 0); returns (task loss, dual term)."""
        loss = task.loss(model, batch)
        objective, penalty = loss, float("nan")
        if self.params.lam:
            dual = self.dual_term(model, model.mapped, model.mask)
            objective, penalty = loss + dual, float(dual.detach())
        grads = torch.autograd.grad(objective, w + theta)
        sgd(w, grads[: len(w)], lr)
        sgd(theta, grads[len(w) :], lr_map)
        return float(loss.detach()), penalty

    def joint_gradient(self, model: FedOTModel, task, batch, params):
        """Alg. 1's simultaneous step: ∇ L̂_i in ``params`` (descent then ascent ones) at one
        point; returns (gradients, task loss, dual term)."""
        loss = task.loss(model, batch)
        dual = self.dual_term(model, model.mapped, model.mask)
        objective = loss + dual - self.regulariser(*self.ascent_split(model, params))
        grads = torch.autograd.grad(objective, params, allow_unused=True)
        grads = [
            torch.zeros_like(q) if g is None else g for q, g in zip(params, grads, strict=True)
        ]
        return grads, float(loss.detach()), float(dual.detach())

    @staticmethod
    def ascent_split(model: FedOTModel, params):
        head_ids = {id(q) for q in model.potential.head.parameters()}
        trunk = [q for n, q in model.named_parameters() if n.startswith(TRUNK_PREFIX)]
        return [q for q in params if id(q) in head_ids], trunk

    def train(self, ctx: ClientContext) -> dict[str, float]:
        p, cfg = self.params, ctx.config
        model: FedOTModel = ctx.model.module
        w, theta, heads, trunk = self.parts(model, ctx)
        lr_map = cfg.lr if p.lr_map is None else p.lr_map
        lr_up = cfg.lr if p.lr_ascent is None else p.lr_ascent
        raw = flat64(heads)
        vbar = ctx.downlink.get(VBAR)
        if vbar is not None:
            assign64(heads, raw - vbar)  # the effective head v_i = ṽ_i − v̄
        v_start = flat64(heads)
        theta_start = [t.detach().clone() for t in theta]
        task = training_task(ctx.task, ctx.data, cfg)
        n = task.num_examples(ctx.data)
        descent = w + theta
        losses: list[float] = []
        penalty = float("nan")
        model.train()
        for idx in step_batches(n, cfg, ctx.generator):
            batch = task.batch(ctx.data, idx)
            if p.gda_mode == "alternating":
                self.ascent(model, batch[0], heads, trunk, lr_up)
                loss, penalty = self.descend(model, task, batch, w, theta, cfg.lr, lr_map)
            else:  # simultaneous: both gradients at the same point, then both steps
                params = descent + heads + trunk
                grads, loss, penalty = self.joint_gradient(model, task, batch, params)
                sgd(w, grads[: len(w)], cfg.lr)
                sgd(theta, grads[len(w) : len(descent)], lr_map)
                sgd(heads + trunk, grads[len(descent) :], -lr_up)
                self.project(model, heads, trunk)
            losses.append(loss)
        dual_norm = float(np.linalg.norm(flat64(heads)))
        delta = flat64(heads) - v_start
        scale = ctx.downlink.get(PERSONAL_SCALE)
        if scale is not None:  # literal_alg1: the personal deltas are divided by n (§3.2)
            s = float(scale[0])
            delta = delta * s
            with torch.no_grad():
                for t, t0 in zip(theta, theta_start, strict=True):
                    t.copy_(t0 + (t - t0) * s)
        assign64(heads, raw + delta)  # the client keeps its raw head ṽ_i + Δṽ_i
        ctx.upload(DUAL_DELTA, delta)
        return {
            "train_loss": float(np.mean(losses)) if losses else float("nan"),
            "local_steps": float(len(losses)),
            "dual_penalty": penalty,
            "dual_norm": dual_norm,
            "map_deviation": map_deviation(model.psi),
        }
