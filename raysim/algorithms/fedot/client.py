"""FedOT-GDA's client (FedOT spec §3.5): local descent–ascent on the regularised objective.

Per local iteration, on one batch B (the client's step stream, ``step_batches``):

    L̂_i = mean_B [ ℓ(f_w(ψ_i(x)), y) + λ φ_i(ψ_i(x)) ] − ρ_v ‖v_i‖² − ρ_U ‖U‖_F²

``alternating`` (the experiments, §3.4): ``k_max`` ascent steps on (v_i, U) at η2, then one
descent step on (w, θ_i) at (η1, η_θ), all on the same batch; ``simultaneous`` (Alg. 1): both
gradients at the same point, then both steps. Plain SGD throughout (§6.4). The caps of §4.3 follow
every ascent step. The head the client trains is v_i = ṽ_i − v̄ (sync centring, §3.3): it loads
its raw ṽ_i, subtracts the server's v̄ (downlink), trains, uploads Δṽ_i and keeps ṽ_i + Δṽ_i.
With λ = 0 the descent loss is exactly the task loss, so with a frozen identity map the predictor
follows FedAvg's trajectory bit for bit (invariant 1).

``dual_centering: exact`` (§3.3, the companion code) trains the round's clients together
(``train_together``): every ascent step moves each v_i by η2·(g_i − mean_k g_k), so Σ v_i stays
where it was at every step, not only at the sync. A client's round is ``begin`` / ``step`` /
``finish`` either way, so the two modes share every line of arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...training.loop import step_batches, training_task
from ..base import ClientAlgorithm, ClientContext
from .channels import DUAL_DELTA, PERSONAL_SCALE, VBAR
from .families import cap_curvature, cap_spectral, map_deviation
from .model import TRUNK_PREFIX, FedOTModel
from .params import FedOTParams


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
    # a copy: ``flat`` may be the object store's read-only array (a downlink's v̄)
    src, offset = torch.from_numpy(np.array(flat, dtype=np.float64)), 0
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


def centre(grads: Sequence[list[torch.Tensor]], k: int, offset: int = 0) -> None:
    """Exact centring: subtract the clients' mean from each client's ``k`` head gradients
    (from ``offset`` on), in place."""
    for j in range(offset, offset + k):
        mean = torch.stack([g[j] for g in grads]).mean(dim=0)
        for g in grads:
            g[j] = g[j] - mean


@dataclass
class LocalRound:
    """One client's local iterations in progress: its model's parts, step sizes, data and
    batches (``FedOTClient.begin`` … ``finish``, or ``Lockstep``'s clients)."""

    model: FedOTModel
    w: list[torch.nn.Parameter]
    theta: list[torch.nn.Parameter]
    heads: list[torch.nn.Parameter]
    trunk: list[torch.nn.Parameter]
    lr: float
    lr_map: float
    lr_up: float
    task: Any
    data: Any
    steps: list[torch.Tensor]  # the batch indices of each local iteration
    losses: list[float] = field(default_factory=list)
    penalty: float = float("nan")
    ctx: ClientContext | None = None
    raw: np.ndarray | None = None  # ṽ_i as loaded (sync centring's bookkeeping)
    v_start: np.ndarray | None = None  # the effective head v_i at the start
    theta_start: list[torch.Tensor] = field(default_factory=list)

    def batch(self, t: int):
        return self.task.batch(self.data, self.steps[t])


class FedOTClient(ClientAlgorithm):
    params: FedOTParams

    @staticmethod
    def parts(model: FedOTModel):
        """(predictor w, map θ_i, head v_i, trunk U) parameter lists of a FedOT model."""
        trunk = [q for n, q in model.named_parameters() if n.startswith(TRUNK_PREFIX)]
        w = [q for q in model.predictor.parameters() if q.requires_grad]
        return w, list(model.psi.parameters()), list(model.potential.head.parameters()), trunk

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
            norm = math.sqrt(float(torch.as_tensor(sq_norm(heads)).detach()))
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

    # ------------------------------------------------------------- one client's round
    def begin(self, ctx: ClientContext) -> LocalRound:
        """Load the effective head v_i = ṽ_i − v̄ and draw the round's batches."""
        p, cfg = self.params, ctx.config
        model: FedOTModel = ctx.model.module
        w, theta, heads, trunk = self.parts(model)
        raw = flat64(heads)
        vbar = ctx.downlink.get(VBAR)
        if vbar is not None:
            assign64(heads, raw - vbar)
        task = training_task(ctx.task, ctx.data, cfg)
        model.train()
        return LocalRound(
            model,
            w,
            theta,
            heads,
            trunk,
            lr=cfg.lr,
            lr_map=cfg.lr if p.lr_map is None else p.lr_map,
            lr_up=cfg.lr if p.lr_ascent is None else p.lr_ascent,
            task=task,
            data=ctx.data,
            steps=list(step_batches(task.num_examples(ctx.data), cfg, ctx.generator)),
            ctx=ctx,
            raw=raw,
            v_start=flat64(heads),
            theta_start=[t.detach().clone() for t in theta],
        )

    def step(self, run: LocalRound, t: int) -> None:
        """Local iteration t: k_max ascent steps then one descent step (alternating), or Alg. 1's
        joint step (simultaneous)."""
        batch = run.batch(t)
        if self.params.gda_mode == "alternating":
            self.ascent(run.model, batch[0], run.heads, run.trunk, run.lr_up)
            loss, run.penalty = self.descend(
                run.model, run.task, batch, run.w, run.theta, run.lr, run.lr_map
            )
        else:
            grads, loss, run.penalty = self.joint_gradient(
                run.model, run.task, batch, run.w + run.theta + run.heads + run.trunk
            )
            self.joint_step(run, grads)
            self.project(run.model, run.heads, run.trunk)
        run.losses.append(loss)

    def joint_step(self, run: LocalRound, grads) -> None:
        """Descent on (w, θ_i) and ascent on (v_i, U) with gradients taken at one point."""
        k, d = len(run.w), len(run.w) + len(run.theta)
        sgd(run.w, grads[:k], run.lr)
        sgd(run.theta, grads[k:d], run.lr_map)
        sgd(run.heads + run.trunk, grads[d:], -run.lr_up)

    def finish(self, run: LocalRound) -> dict[str, float]:
        """Keep ṽ_i + Δṽ_i, upload Δṽ_i; literal_alg1 scales the personal deltas by 1/n."""
        heads, theta, ctx = run.heads, run.theta, run.ctx
        assert ctx is not None and run.v_start is not None and run.raw is not None
        dual_norm = float(np.linalg.norm(flat64(heads)))
        delta = flat64(heads) - run.v_start
        scale = ctx.downlink.get(PERSONAL_SCALE)
        if scale is not None:  # literal_alg1: the personal deltas are divided by n (§3.2)
            s = float(scale[0])
            delta = delta * s
            with torch.no_grad():
                for t, t0 in zip(theta, run.theta_start, strict=True):
                    t.copy_(t0 + (t - t0) * s)
        assign64(heads, run.raw + delta)  # the client keeps its raw head ṽ_i + Δṽ_i
        ctx.upload(DUAL_DELTA, delta)
        return {
            "train_loss": float(np.mean(run.losses)) if run.losses else float("nan"),
            "local_steps": float(len(run.losses)),
            "dual_penalty": run.penalty,
            "dual_norm": dual_norm,
            "map_deviation": map_deviation(run.model.psi),
        }

    def train(self, ctx: ClientContext) -> dict[str, float]:
        run = self.begin(ctx)
        for t in range(len(run.steps)):
            self.step(run, t)
        return self.finish(run)

    # ------------------------------------------------- workers.execution: batched
    def unbatchable(self, ctxs: Sequence[ClientContext]) -> str:
        from .batched import refusal

        return refusal(self.params, ctxs)

    def train_batched(self, model, ctxs, starts):
        """The group's local iterations vectorised over its clients (``batched.GroupRound``)."""
        from .batched import GroupRound

        return GroupRound(self.params, model, ctxs, starts).run()

    # ------------------------------------------------------- clients together (exact)
    def train_together(self, ctxs: Sequence[ClientContext]) -> list[dict[str, float]]:
        """The round's clients in lockstep with exact centring (FedOT spec §3.3); under sync
        centring (batched execution's groups) one after another, as ``train`` does."""
        if not self.trains_together:
            return [self.train(ctx) for ctx in ctxs]
        runs = [self.begin(ctx) for ctx in ctxs]
        lengths = {len(r.steps) for r in runs}
        if len(lengths) > 1:
            raise ValueError(
                "dual_centering exact steps the clients in lockstep, so every client needs the "
                f"same number of local iterations; these have {sorted(lengths)}: set "
                "local.max_steps with local.sampling independent"
            )
        self.lockstep(runs, exact=True)
        return [self.finish(r) for r in runs]

    def lockstep(self, runs: Sequence[LocalRound], exact: bool) -> None:
        """Every run's local iterations, iteration by iteration. ``exact``: at every ascent
        step the heads move by their gradients minus the clients' mean gradient, so Σ v_i stays
        where it started; otherwise each client steps on its own, as in ``train``."""
        for t in range(len(runs[0].steps) if runs else 0):
            if not exact:
                for r in runs:
                    self.step(r, t)
                continue
            batches = [r.batch(t) for r in runs]
            if self.params.gda_mode == "alternating":
                self.ascent_together(runs, [b[0] for b in batches])
                for r, b in zip(runs, batches, strict=True):
                    loss, r.penalty = self.descend(r.model, r.task, b, r.w, r.theta, r.lr, r.lr_map)
                    r.losses.append(loss)
                continue
            grads = []
            for r, b in zip(runs, batches, strict=True):
                g, loss, r.penalty = self.joint_gradient(
                    r.model, r.task, b, r.w + r.theta + r.heads + r.trunk
                )
                r.losses.append(loss)
                grads.append(g)
            first = runs[0]
            centre(grads, len(first.heads), offset=len(first.w) + len(first.theta))
            for r, g in zip(runs, grads, strict=True):
                self.joint_step(r, g)
            self.project_together(runs)

    def ascent_together(self, runs: Sequence[LocalRound], xs: Sequence[torch.Tensor]) -> None:
        mapped = [mapped_features(r.model, x) for r, x in zip(runs, xs, strict=True)]
        for _ in range(self.params.ascent_steps):
            grads = []
            for r, (y, mask, feats) in zip(runs, mapped, strict=True):
                g = self.ascent_gradient(r.model, y, mask, feats, r.heads, r.trunk)
                if g is None:
                    return
                grads.append(g)
            centre(grads, len(runs[0].heads))
            for r, g in zip(runs, grads, strict=True):
                sgd(r.heads + r.trunk, g, -r.lr_up)
            self.project_together(runs)

    def project_together(self, runs: Sequence[LocalRound]) -> None:
        """The caps under exact centring: the trunk cap per client; caps that would break
        Σ v_i = 0 (γ and W1's ‖v_i‖ ≤ 1) scale every client's head by one common factor."""
        p = self.params
        if p.trunk_cap:
            for r in runs:
                if r.trunk:
                    cap_spectral(r.model.potential.trunk.weight)
        limits = []
        if p.gamma_cap != "none":
            peak = max(
                (
                    float(t.detach().abs().max())
                    for r in runs
                    for t in r.model.potential.curvature()
                ),
                default=0.0,
            )
            limits.append(p.gamma / peak if peak > p.gamma else 1.0)
        if p.cost == "w1_lip":
            peak = max(float(np.linalg.norm(flat64(r.heads))) for r in runs)
            limits.append(1.0 / peak if peak > 1.0 else 1.0)
        factor = min(limits, default=1.0)
        if factor < 1.0:
            with torch.no_grad():
                for r in runs:
                    for h in r.heads:
                        h.mul_(factor)
