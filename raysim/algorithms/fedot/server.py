"""FedOT-GDA's server (FedOT spec §3.5, §3.3, §8.1).

At round end: w (and the nn potential's trunk U, which travels in the global vector) ← the mean
of the participants' copies (FedAvg's sample-weighted mean: uniform for the paper's equal m);
U ← its spectral projection ‖U_l‖₂ ≤ 1 (§4.3); v̄ ← v̄ + (1/n) Σ_{i∈S} Δṽ_i over all n clients
(sync centring, §3.3). θ_i and ṽ_i never reach it; with ``dual_sum_check`` the simulator hands it
every client's stored head after each round, and it logs ‖Σ_i v_i‖ over all n clients with
v_i = ṽ_i − v̄ (a client not yet sampled: ṽ_i = 0), and that norm over the mean ‖v_i‖. It logs the
trunk's norms too, and it stops the run
(``Diverged``) when anything it sees is not finite, a client's ‖v_i‖, ‖ψ_i − id‖ or loss passes
``divergence_limit``, or its dual term λ·mean φ_i passes ``dual_limit``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ..base import Diverged, Downlink, Update
from ..context import ServerContext
from ..general.fedavg import FedAvg
from .channels import DUAL_DELTA, PERSONAL_SCALE, VBAR
from .model import TRUNK_PREFIX
from .params import FedOTParams

#: the dual heads' names in a client's state (``model.DUAL``: the raw heads ṽ_i)
HEAD_PREFIX = "potential.head."

#: client metrics the divergence guard watches
WATCHED = ("dual_norm", "map_deviation", "train_loss")


class FedOTStrategy(FedAvg):
    params: FedOTParams
    stop_on_nonfinite = True

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.vbar: np.ndarray | None = None  # float64, sized by the first Δṽ (the head's size)
        self.round_deltas: list[np.ndarray] = []

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self.trunk = [t for t in ctx.layout.select(pattern="^" + TRUNK_PREFIX) if len(t.shape) == 2]

    transient = ("trunk",)

    @property
    def reads_client_states(self) -> bool:
        return self.params.dual_sum_check

    def state_metrics(self, states: Mapping[int, Mapping[str, np.ndarray]]) -> dict[str, float]:
        """‖Σ_i v_i‖ over all n clients, v_i = ṽ_i − v̄, from their stored heads, and its ratio
        to the mean ‖v_i‖ (§3.3: zero under sync centring once every client has been seen)."""
        if self.vbar is None:
            return {}
        heads = [
            np.concatenate([np.asarray(v, np.float64).ravel() for k, v in s.items()
                            if k.startswith(HEAD_PREFIX)])
            for s in states.values()
        ]  # fmt: skip
        unseen = self.num_clients - len(heads)  # their raw heads are still the built zeros
        total = np.sum([*heads, np.zeros_like(self.vbar)], axis=0) - self.num_clients * self.vbar
        norms = [np.linalg.norm(h - self.vbar) for h in heads]
        norms += [np.linalg.norm(self.vbar)] * unseen
        mean = float(np.mean(norms))
        residual = float(np.linalg.norm(total))
        return {"dual_sum_norm": residual, "dual_sum_ratio": residual / mean if mean else 0.0}

    def notices(self) -> list[str]:
        """The nn potential's local max problem is concave in (v_i, v₀) only where
        λ² < 4ρ_vρ_U (its Hessian's 2×2 block, the trunk bias v₀ uncapped); otherwise the heads'
        common drift can grow between syncs under sync centring (issue 45 (2))."""
        p = self.params
        rho_v, rho_u = p.rho
        if p.potential != "nn" or p.dual_centering != "sync" or p.lam**2 < 4 * rho_v * rho_u:
            return []
        return [
            f"fedot: λ² = {p.lam**2:.3g} ≥ 4ρ_vρ_U = {4 * rho_v * rho_u:.3g}: the nn potential's "
            "local max problem is not concave in (v_i, v₀), so under sync centring the heads "
            "can drift apart between syncs (the colour cell at τ = 5 collapsed so; ρ_U = 0.1 or "
            "dual_centering: exact ran it to 85 %); dual_limit stops such a run"
        ]

    def configure(self, round_index: int, clients: Sequence[int]) -> Downlink:
        tensors = {}
        if self.vbar is not None:
            tensors[VBAR] = self.vbar
        if self.params.personal_step == "literal_alg1":
            tensors[PERSONAL_SCALE] = np.array([1.0 / self.num_clients], dtype=np.float32)
        return Downlink(tensors=tensors)

    def on_arrival(self, update: Update) -> bool:
        limits = {key: ("divergence_limit", self.params.divergence_limit) for key in WATCHED}
        limits["dual_penalty"] = ("dual_limit", self.params.dual_limit)
        for key, (name, limit) in limits.items():
            value = update.metrics.get(key)
            if key == "dual_penalty" and value is not None and math.isnan(value):
                continue  # λ = 0: no dual term
            if value is not None and not abs(value) <= limit:
                who = f"round {update.arrival_round}: client {update.client_id}"
                exact = self.params.dual_centering == "sync" and key == "dual_penalty"
                raise Diverged(
                    f"{who}'s {key} is {value:.4g} ({name} {limit:g}); "
                    + (
                        "the heads' common drift between syncs grew: set dual_centering: exact "
                        "(the colour cell at τ = 5 collapsed under sync and ran under exact), "
                        "or lower lr_ascent, k_max or the local steps"
                        if exact
                        else "lower the step sizes (lr_map, lr_ascent, local.lr) or λ, raise "
                        "ρ_v or ρ_U, or set gamma_cap (FedOT spec §9.2)"
                    )
                )
        self.round_deltas.append(np.asarray(update.extras[DUAL_DELTA], dtype=np.float64))
        return super().on_arrival(update)

    def on_round_end(self, round_index: int) -> bool:
        changed = super().on_round_end(round_index)
        if self.trunk and self.params.trunk_cap:
            self.weights = project_trunk(self.weights, self.trunk)
        if self.round_deltas:
            if self.vbar is None:
                self.vbar = np.zeros(len(self.round_deltas[0]), np.float64)
            self.vbar = self.vbar + np.sum(self.round_deltas, axis=0) / self.num_clients
            self.round_deltas = []
        for name, value in (("weights", self.weights), ("v̄", self.vbar)):
            if value is not None and not np.isfinite(value).all():
                raise Diverged(f"round {round_index}: the server's {name} are not finite")
        return changed

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.vbar is not None:
            out["dual_mean_norm"] = float(np.linalg.norm(self.vbar))
        if self.trunk:
            u = [self.weights[t.slice].reshape(t.shape) for t in self.trunk]
            out["trunk_norm"] = float(np.sqrt(sum((x.astype(np.float64) ** 2).sum() for x in u)))
            out["trunk_sigma_max"] = max(float(np.linalg.norm(x, 2)) for x in u)
        return out


def project_trunk(weights: np.ndarray, trunk) -> np.ndarray:
    """A copy of ``weights`` with every trunk matrix U_l divided by max(1, σ_max(U_l))."""
    out = weights.copy()
    for t in trunk:
        u = out[t.slice].reshape(t.shape)
        sigma = float(np.linalg.norm(u.astype(np.float64), 2))
        if sigma > 1.0:
            out[t.slice] = (u / np.float32(sigma)).reshape(-1)
    return out
