"""The general-purpose methods' and hooks' parameters and specs (torch-free: a config is
checked against them before any model loads, ``raysim/algorithms/spec.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..spec import BehaviourParams, HookParams, HookSpec, MethodParams, MethodSpec


class FedProxParams(MethodParams):
    mu: float = Field(0.01, ge=0, description="proximal coefficient μ")


class FedOptParams(MethodParams):
    server_lr: float = Field(0.01, gt=0, description="server learning rate η")
    beta1: float = Field(
        0.9, ge=0, lt=1, description="β1, the decay of the first moment m of the mean delta"
    )
    beta2: float = Field(
        0.99,
        ge=0,
        lt=1,
        description="β2 of the second moment v (fedadam: v ← β2 v + (1−β2) Δ²; fedyogi: "
        "Yogi's signed update)",
    )
    tau: float = Field(1e-3, gt=0, description="adaptivity ε (τ in Reddi et al.)")


class FedAsyncParams(MethodParams):
    mixing: float = Field(0.4, gt=0, le=1, description="α, the mixing hyper-parameter")
    staleness: Literal["constant", "polynomial", "hinge"] = Field(
        "polynomial",
        description="s(τ) that scales α by staleness τ (Xie et al. §5.2): constant 1; "
        "polynomial (τ+1)^(−a); hinge 1 up to τ = b, then 1/(a(τ−b)+1)",
    )
    a: float = Field(0.5, ge=0, description="decay exponent (polynomial) or slope (hinge)")
    b: float = Field(4.0, ge=0, description="hinge: the staleness up to which s(τ) = 1")
    form: Literal["model_mixing", "delta"] = Field(
        "model_mixing",
        description="model_mixing: ω ← (1−α_t)ω + α_t·(the client's trained model), the "
        "original; delta: ω ← ω + α_t·Δ (Feddle spec A16)",
    )
    staleness_unit: Literal["versions", "rounds"] = Field(
        "versions",
        description="τ in s(τ): versions elapsed since the download (Feddle spec §4.3, one per "
        "arrival, so about S a round) or rounds elapsed (Xie et al.'s epochs, one per round)",
    )


StalenessWeight = Literal["none", "inv_sqrt"]


class FedBuffParams(MethodParams):
    buffer_size: int = Field(10, ge=1, description="K, updates per flush")
    server_lr: float = Field(
        1.0, gt=0, description="η: a flush adds η times the buffer's mean delta"
    )
    staleness_weight: StalenessWeight = Field(
        "none",
        description="w(τ) on each buffered delta: none (1) or inv_sqrt, 1/√(1+τ) with τ in "
        "versions (Feddle spec A9)",
    )
    per_round: bool = Field(
        False,
        description="flush at every round end, K := the round's arrivals (fedbuff_per_round), "
        "instead of at K arrivals",
    )


class FedBuffPerRoundParams(FedBuffParams):
    per_round: bool = Field(
        True,
        description="flush at every round end, K := the round's arrivals (Feddle spec §4.4); "
        "false: at buffer_size arrivals, as fedbuff",
    )


class CA2FLParams(MethodParams):
    buffer_size: int = Field(10, ge=1, description="K, updates per flush")
    server_lr: float = Field(1.0, gt=0, description="η, the server learning rate of a flush")


class DampParams(HookParams):
    mu: float = Field(0.01, ge=0, le=1, description="μ, the weight kept on the previous model")


class ClipStepParams(HookParams):
    max_norm: float = Field(1.0, gt=0, description="C, the largest L2 norm of one server step")


class CorruptParams(BehaviourParams):
    value: Literal["nan", "inf"] = Field(
        "nan", description="what replaces the update's first entry (the server rejects it)"
    )


class ScaleParams(BehaviourParams):
    factor: float = Field(10.0, description="the delta is multiplied by this")


class SignFlipParams(BehaviourParams):
    scale: float = Field(1.0, gt=0, description="the client sends −scale·(its own delta)")


class SignFlipMeanParams(BehaviourParams):
    scale: float = Field(1.0, gt=0, description="the clients send −scale·(the benign mean)")


class GaussianAttackParams(BehaviourParams):
    mu: float = Field(0.0, description="μ of the N(μ, σ²) update the client sends")
    sigma: float = Field(1.0, ge=0, description="σ of the N(μ, σ²) update the client sends")


class IPMParams(BehaviourParams):
    epsilon: float = Field(
        0.1, gt=0, description="ε: the clients send −ε·(the benign mean) (Xie et al. 2019)"
    )


class ALIEParams(BehaviourParams):
    z: float | None = Field(
        None,
        description="mean + z·std per coordinate; None: Baruch et al.'s z_max for the round's "
        "n updates and f attackers",
    )


class MinMaxParams(BehaviourParams):
    perturbation: Literal["std", "unit", "sign"] = Field(
        "std", description="p: −std, −mean/‖mean‖ or −sign(mean) (Shejwalkar, Houmansadr §IV)"
    )
    gamma_init: float = Field(10.0, gt=0, description="the search's first γ (Algorithm 1)")


class MinSumParams(MinMaxParams):
    bound: Literal["max", "min"] = Field(
        "max",
        description="the benign updates' largest sum of squared distances (max, the paper's "
        "formulation) or their smallest (min, a stricter attacker)",
    )


M = "raysim.algorithms.general."
A = M + "attacks"
SPECS = (
    MethodSpec(
        "fedavg", M + "fedavg", reference="McMahan et al. 2017; Feddle spec §4.2", sums=True
    ),
    MethodSpec(
        "fedprox",
        M + "fedprox",
        FedProxParams,
        reference="Li et al. 2020 (FedProx)",
        sums=True,
        partial_work=True,
    ),
    MethodSpec("fedadam", M + "fedadam", FedOptParams, reference="Reddi et al. 2021", sums=True),
    MethodSpec("fedyogi", M + "fedyogi", FedOptParams, reference="Reddi et al. 2021", sums=True),
    MethodSpec(
        "fedasync",
        M + "fedasync",
        FedAsyncParams,
        reference="Xie et al. 2019; Feddle spec §4.3",
        asynchronous=True,
        each_because="each arrival is mixed into the model on its own, at a weight that its "
        "staleness sets, before the next one arrives",
    ),
    MethodSpec(
        "fedbuff",
        M + "fedbuff",
        FedBuffParams,
        reference="Nguyen et al. 2022; Feddle spec §4.4",
        sums=True,
        asynchronous=True,
    ),
    MethodSpec(
        "fedbuff_per_round",
        M + "fedbuff",
        FedBuffPerRoundParams,
        reference="FedBuff flushed at every round end (K := |R_k|); Feddle spec §4.4, I-4, I-6",
        sums=True,
    ),
    MethodSpec(
        "ca2fl",
        M + "ca2fl",
        CA2FLParams,
        reference="Wang et al. 2024 (CA2FL); Feddle spec §4.5",
        asynchronous=True,
        each_because="it keeps each client's latest update as that client's calibration",
    ),
    HookSpec(
        "server hook",
        "damp",
        M + "mixers",
        DampParams,
        "FedBaF spec §2.6 (paper_damped FedProx server)",
    ),
    HookSpec(
        "server hook", "clip_step", M + "mixers", ClipStepParams, "norm bounding of the server step"
    ),
    HookSpec("client behaviour", "corrupt", M + "behaviours", CorruptParams, "fault injection"),
    HookSpec("client behaviour", "scale_update", M + "behaviours", ScaleParams, "update boosting"),
    HookSpec("client behaviour", "sign_flip", A, SignFlipParams, "sign flipping of its own update"),
    HookSpec(
        "client behaviour",
        "gaussian_update",
        A,
        GaussianAttackParams,
        "Gaussian attack (Blanchard et al. 2017, §5)",
    ),
    HookSpec(
        "client behaviour",
        "sign_flip_mean",
        A,
        SignFlipMeanParams,
        "sign flipping of the benign mean (omniscient; byzfl's SignFlipping)",
        forges=True,
    ),
    HookSpec(
        "client behaviour",
        "ipm",
        A,
        IPMParams,
        "inner product manipulation (Xie, Koyejo, Gupta 2019; omniscient)",
        forges=True,
    ),
    HookSpec(
        "client behaviour",
        "alie",
        A,
        ALIEParams,
        "a little is enough (Baruch, Baruch, Goldberg 2019; omniscient)",
        forges=True,
    ),
    HookSpec(
        "client behaviour",
        "min_max",
        A,
        MinMaxParams,
        "min-max (Shejwalkar, Houmansadr 2021; omniscient)",
        forges=True,
    ),
    HookSpec(
        "client behaviour",
        "min_sum",
        A,
        MinSumParams,
        "min-sum (Shejwalkar, Houmansadr 2021; omniscient)",
        forges=True,
    ),
)
#: by name, for the implementation modules (``Method.of(METHODS["fedprox"], ...)``)
METHODS = {s.name: s for s in SPECS if isinstance(s, MethodSpec)}
HOOKS = {s.name: s for s in SPECS if isinstance(s, HookSpec)}
