"""FedOT-GDA's hyper-parameters and switches (FedOT spec §3–4, §6.4, §10), defaults first; its
personalisation baselines' parameters; and their specs (torch-free: a config is checked against
them before any model loads, ``raysim/algorithms/spec.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ..spec import MethodParams, MethodSpec, Needs

MapFamily = Literal["affine_diag", "affine_full", "pixel_relu", "lowrank_affine"]


PotentialFamily = Literal["quad_diag", "quad_full", "nn"]

#: FedOT-GDA and Fed-FOMAML step by hand with plain SGD (FedOT spec §6.4)
PLAIN_SGD = Needs(plain_sgd=True, example="examples/fedot/mini.yaml")


class FedOTParams(MethodParams):
    """Descent runs at ``local.lr`` (η1) with plain SGD; the local iterations τ are the steps of
    ``local:`` (``max_steps`` with ``sampling: independent`` draws B samples afresh per
    iteration, §3.5); each iteration's ``k_max`` ascent steps and its descent step share its
    batch and draw nothing from the client's random stream."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    lam: float = Field(1.0, ge=0, alias="lambda", description="λ, weight of the OT term (eq. 10)")
    gamma: float = Field(0.5, ge=0, lt=1, description="γ of eq. 10 (not reported; §6.4 default)")
    rho_v: float | None = Field(
        None, gt=0, description="ρ_v on ‖v_i‖² (None: λ/(1−γ), eq. 10; §2.5 keeps it apart)"
    )
    rho_u: float | None = Field(
        None, gt=0, description="ρ_U on ‖U‖_F² (None: λ/(1−γ); lower it when U collapses, §4.3)"
    )
    lr_map: float | None = Field(None, ge=0, description="η_θ of the maps (None: local.lr)")
    lr_ascent: float | None = Field(None, gt=0, description="η2 of the potentials (None: local.lr)")
    k_max: int | None = Field(
        None, ge=1, description="ascent steps per descent step (None: 10 alternating, 1 simult.)"
    )
    gda_mode: Literal["alternating", "simultaneous"] = Field(
        "alternating", description="§3.4: k_max ascent then 1 descent | Alg. 1's joint step"
    )
    personal_step: Literal["local", "literal_alg1"] = Field(
        "local", description="§3.2: personal deltas as they are | divided by n (Alg. 1 literal)"
    )
    dual_centering: Literal["sync", "exact"] = Field(
        "sync",
        description="§3.3: re-centre Σ v_i = 0 at sync with the server's mean v̄ | at every "
        "ascent step, the round's clients trained together on one worker (the code's mode). "
        "Only exact is Algorithm 1's projection at every step: under sync the descent sees "
        "heads the round's ascent moved off centre (so n = 1 is plain ERM only under exact, or "
        "with one simultaneous step, τ = 1; §7.2 invariant 9)",
    )
    cost: Literal["w2_reg", "w1_lip"] = Field(
        "w2_reg", description="eq. 10 (regularised W2) | eq. 8 (W1: ‖v_i‖ ≤ 1, spectral caps)"
    )
    psi_family: MapFamily = Field(
        "affine_diag",
        description="each client's map ψ_i, starting at the identity (FedOT spec §4): "
        "affine_diag a ⊙ x + b; affine_full Θx + θ₀; pixel_relu ReLU(Θ₂x + θ₁) + θ₀; "
        "lowrank_affine e + BAe + b on embeddings (§9.4)",
    )
    psi_scope: Literal["pixel", "image"] = Field(
        "pixel",
        description="pixel_relu: per pixel's RGB 3-vector (colour-shifted inputs) or on the "
        "flat image",
    )
    psi_rank: int = Field(4, ge=1, description="rank of lowrank_affine maps (§9.4)")
    potential: PotentialFamily = Field(
        "quad_diag",
        description="each client's potential φ_i (FedOT spec §2.4, §4): quad_diag Σ_d (½q_d y_d² "
        "+ l_d y_d); quad_full ½yᵀVy + lᵀy; nn v₂ᵀReLU(V₁y + v₀) with a shared trunk",
    )
    potential_input: Literal["raw", "embedding_std"] = Field(
        "raw",
        description="§9.4 (an extension): the map and potentials work on the embeddings e as they "
        "are | on e/σ_e, σ_e the std of the token-embedding table, so the matched moments are O(1)",
    )
    hidden: int = Field(32, ge=1, description="h_φ, width of the nn potential's trunk (§4.2)")
    gamma_cap: Literal["none", "clamp", "rescale_each", "rescale_all"] = Field(
        "none",
        description="§4.3 cap ‖V_i‖₂ ≤ γ on quadratic heads (the code has none): clamp each "
        "entry or eigenvalue; rescale_each: each client's head alone, by its own largest "
        "magnitude; rescale_all: one factor for every client's head, §9.2's pilot (a global "
        "rescale that keeps Σ_i v_i = 0; needs dual_centering: exact). Under exact centring "
        "every cap is one common factor",
    )
    trunk_cap: bool = Field(True, description="‖U_l‖₂ ≤ 1 after each ascent step and averaging")
    dual_sum_check: bool = Field(
        True,
        description="log ‖Σ_i v_i‖ over all n clients after every round from their stored "
        "heads, v_i = ṽ_i − v̄ (§3.3's zero-sum, claim A5; the simulator reads every client's "
        "state for it: off for large n)",
    )
    divergence_limit: float = Field(
        1e6, gt=0, description="stop the run when ‖v_i‖, ‖ψ_i − id‖ or the loss exceeds it"
    )
    dual_limit: float = Field(
        1e3,
        gt=0,
        description="stop the run when a client's dual term λ·mean φ_i exceeds it (a collapsed "
        "ascent: the colour cell at τ = 5 under sync centring grew it ×3 every 20 rounds to 5e4 "
        "at chance accuracy; the grid's healthy runs stay under 1)",
    )

    @field_validator("gamma_cap", mode="before")
    @classmethod
    def _no_ambiguous_rescale(cls, value: object) -> object:
        if value == "rescale":
            raise ValueError(
                "gamma_cap: rescale is ambiguous: rescale_each scales each client's head alone "
                "(what sync and batched centring did), rescale_all scales every client's by one "
                "factor as §9.2's pilot did (dual_centering: exact)"
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> FedOTParams:
        if self.gamma_cap == "rescale_all" and self.dual_centering != "exact":
            raise ValueError(
                "gamma_cap: rescale_all needs every client's head at once: set "
                "dual_centering: exact, or gamma_cap: rescale_each"
            )
        if self.gda_mode == "simultaneous" and self.k_max not in (None, 1):
            raise ValueError("gda_mode simultaneous takes one ascent step per descent (k_max 1)")
        return self

    @property
    def trains_together(self) -> bool:
        """``dual_centering: exact`` couples the round's clients at every ascent step."""
        return self.dual_centering == "exact"

    @property
    def ascent_steps(self) -> int:
        if self.k_max is not None:
            return self.k_max
        return 10 if self.gda_mode == "alternating" else 1

    @property
    def rho(self) -> tuple[float, float]:
        """(ρ_v, ρ_U); both 0 under ``cost: w1_lip`` (eq. 8 has constraints, no penalty)."""
        if self.cost == "w1_lip":
            return 0.0, 0.0
        default = self.lam / (1.0 - self.gamma)
        return (
            default if self.rho_v is None else self.rho_v,
            default if self.rho_u is None else self.rho_u,
        )


class LFedAvgParams(MethodParams):
    finetune_steps: int = Field(500, ge=0, description="local SGD iterations before testing [P]")
    finetune_lr: float | None = Field(None, gt=0, description="None: local.lr [D]")


class FOMAMLParams(MethodParams):
    alpha: float | None = Field(None, ge=0, description="inner step α (None: local.lr) [D]")
    beta: float | None = Field(None, gt=0, description="outer step β (None: local.lr) [D]")
    eval_steps: int = Field(1, ge=0, description="adaptation steps before testing (one [S])")


class FedMIParams(MethodParams):
    alpha: float = Field(0.5, ge=0, le=1, description="weight of the local model [D]")
    space: Literal["output", "param"] = Field(
        "output", description="mix the predicted probabilities | the parameters [D]"
    )


M = "raysim.algorithms.fedot."
SPECS = (
    MethodSpec(
        "fedot",
        M + "method",
        FedOTParams,
        PLAIN_SGD,
        "FedOT-GDA (Farnia et al. 2022); FedOT spec §3",
        sums=True,
        own_training=True,
    ),
    MethodSpec(
        "l_fedavg",
        M + "baselines",
        LFedAvgParams,
        reference="L-FedAvg (local fine-tuning of FedAvg); FedOT spec §5",
        sums=True,
    ),
    MethodSpec(
        "fed_fomaml",
        M + "baselines",
        FOMAMLParams,
        PLAIN_SGD,
        "Fallah et al. 2020 (Per-FedAvg, first order); FedOT spec §5",
        batchable=False,
        sums=True,
        own_training=True,
    ),
    MethodSpec(
        "fedmi",
        M + "baselines",
        FedMIParams,
        reference="Mansour et al. 2020 (model interpolation); FedOT spec §5",
        batchable=False,
        sums=True,
        own_training=True,
    ),
)
#: by name, for the implementation modules (``Method.of(METHODS["fedot"], ...)``)
METHODS = {s.name: s for s in SPECS}
