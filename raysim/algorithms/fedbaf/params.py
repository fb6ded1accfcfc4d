"""FedBaF's and its adversaries' parameters and specs (torch-free: a config is checked
against them before any model loads, ``raysim/algorithms/spec.py``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ..registry import method_spec
from ..spec import BehaviourParams, HookParams, HookSpec, MethodSpec, Needs
from .matching import MatchRule


class FedBaFParams(HookParams):
    foundation: str = Field(description="the server-private foundation weights (safetensors)")
    psi: float = Field(1.0, ge=0, description="ψ; c_0 ∈ [ψ, 2ψ] (§2.2; 1 is the default)")
    match: MatchRule = Field(
        "exact",
        description="which global tensors mix with which foundation tensors: exact (same name "
        "and shape), shape_in_order, or leading_slice (FedBaF spec §2.4)",
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="regular expressions (re.search) of tensor names never mixed, e.g. ['^fc\\.']",
    )
    tau_scope: Literal["all", "matched"] = Field(
        "all",
        description="the vector whose norms give r_t: every aggregated tensor, or the matched "
        "ones only (FedBaF spec §2.4 (c))",
    )
    rng: Literal["seeded", "secure"] = Field(
        "seeded",
        description="the u_t stream: seeded (reproducible, resumed with the run) or secure (OS "
        "entropy; FedBaF spec §2.5)",
    )
    tau_decay: bool = Field(
        True, description="§3's ablation: false drops the √(t+1) from τ_t = r_t/√(t+1)"
    )
    schedule: Literal["r_t", "decay_only"] = Field(
        "r_t",
        description='§3\'s ablation "a mixing schedule without r_t": decay_only puts 1 for '
        "r_t in τ_t, so c_t = ψ·u_t/√(t+1) (r_t is still logged)",
    )
    tau0_from: Literal["first_movement", "round_zero"] = Field(
        "first_movement",
        description="where τ_0 comes from (§2.2, §2.5's guard, §7.2 inv. 8): first_movement: "
        "the first round whose τ_t is above 1e-12, with c_t = 0 until then (r_0 = 0: no "
        "arrival, every round-0 update rejected, a warm-up); round_zero: round 0's, floored at "
        "1e-12 as the spec writes it, which after r_0 = 0 makes c_t about 1e12·τ_t, and the "
        "broadcast the foundation itself",
    )
    alpha_random: bool = Field(
        True, description="false: u_t = 1.5 every round, a static α (§6.2's E0 control)"
    )
    log_private: bool = Field(
        False,
        description="log the matched foundation tensors as an MLflow artifact "
        "(private/foundation.safetensors) and tag the run raysim.restricted (§7.1)",
    )
    variant: Literal["mix", "weight_init"] = Field(
        "mix",
        description="mix: FedBaF; weight_init: the §3 baseline, w_0 = w_pre on matched layers, "
        "no mixing (it sends the foundation in round 0: the auditor's positive control)",
    )


class FedBaFMethodParams(FedBaFParams):
    base: Literal["fedavg", "fedprox", "fedadam"] = Field(
        "fedavg", description="the bases §2.6 names; any other composes through hooks.server"
    )
    base_params: dict[str, Any] = Field(
        default_factory=dict, description="the base method's own parameters, e.g. {mu: 0.01}"
    )
    fedprox_server_mode: Literal["paper_damped", "standard"] = Field(
        "paper_damped",
        description="base fedprox: the server step damped toward the previous model, (1−μ)·mean "
        "+ μ·w_t (the paper's line 8), or the plain weighted mean (FedBaF spec §2.6)",
    )

    @model_validator(mode="after")
    def _check_base(self) -> FedBaFMethodParams:
        try:
            method_spec(self.base).params(**self.base_params)
        except ValueError as e:
            raise ValueError(f"fedbaf base_params for {self.base!r}: {e}") from None
        return self

    def base_method_params(self) -> Any:
        return method_spec(self.base).params(**self.base_params)


class LabelShuffleParams(BehaviourParams):
    """FedBaF spec §4.4. The unstated choices are switches with the spec's defaults."""

    epoch_scale: float = Field(1.0, gt=0, description="λ: the attacker's epochs are E·λ or E/λ")
    epoch_rule: Literal["multiply", "divide"] = Field(
        "multiply", description="multiply: vision (λ·E epochs); divide: LM (E/λ, as steps)"
    )
    permutation: Literal["fixed", "per_visit"] = Field(
        "fixed", description="fixed: one permutation per client made at setup (§4.4's default)"
    )


class BackdoorParams(BehaviourParams):
    """A pixel-pattern trigger (FedBaF spec §6.3, an extension after Bagdasaryan et al. 2020)."""

    target: int = Field(0, ge=0, description="the class triggered inputs are relabelled to")
    size: int = Field(2, ge=1, description="side of the square trigger in the bottom-right corner")
    value: float = Field(1.0, description="the trigger's pixel value (1.0 = white for [0, 1] data)")
    poison_fraction: float = Field(0.5, gt=0, le=1, description="share of the client's samples")
    boost: float = Field(1.0, gt=0, description="the update is multiplied by this")
    image_shape: tuple[int, int] | None = Field(
        None, description="(H, W) of flat inputs; default: a square image"
    )


class ObserveParams(BehaviourParams):
    dir: str = Field(description="where the observers write their records (shared by all)")


M = "raysim.algorithms.fedbaf."
SPECS = (
    HookSpec(
        "server hook",
        "fedbaf",
        M + "mixer",
        FedBaFParams,
        "FedBaF (Park et al. 2024): mix a server-private foundation model in; FedBaF spec §2",
        secrets=True,  # the foundation's matched tensors: the leak auditor is on by default
    ),
    MethodSpec(
        "fedbaf",
        M + "method",
        FedBaFMethodParams,
        Needs(example="examples/fedbaf/mini.yaml"),
        "FedBaF (Park et al. 2024) over FedAvg, FedProx or FedAdam; FedBaF spec §2",
        secrets=True,
        sums=True,
        own_training=True,
    ),
    HookSpec(
        "client behaviour",
        "label_shuffle",
        M + "adversaries",
        LabelShuffleParams,
        "FedBaF spec §4.4 (untargeted attacker)",
    ),
    HookSpec(
        "client behaviour",
        "backdoor",
        M + "adversaries",
        BackdoorParams,
        "FedBaF spec §6.3 (pixel trigger)",
    ),
    HookSpec(
        "client behaviour",
        "observe",
        M + "adversaries",
        ObserveParams,
        "FedBaF spec §6.3 (collusion observer)",
    ),
)
#: by name, for the implementation modules (``Method.of(METHODS["fedbaf"], ...)``)
METHODS = {s.name: s for s in SPECS if isinstance(s, MethodSpec)}
HOOKS = {s.name: s for s in SPECS if isinstance(s, HookSpec)}
