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
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.99, ge=0, lt=1)
    tau: float = Field(1e-3, gt=0, description="adaptivity ε (τ in Reddi et al.)")


class FedAsyncParams(MethodParams):
    mixing: float = Field(0.4, gt=0, le=1, description="α, the mixing hyper-parameter")
    staleness: Literal["constant", "polynomial", "hinge"] = "polynomial"
    a: float = Field(0.5, ge=0, description="decay exponent (polynomial) or slope (hinge)")
    b: float = Field(4.0, ge=0, description="hinge threshold")
    form: Literal["model_mixing", "delta"] = "model_mixing"
    staleness_unit: Literal["versions", "rounds"] = Field(
        "versions",
        description="τ in s(τ): versions elapsed since the download (feddle.md §4.3, one per "
        "arrival, so about S a round) or rounds elapsed (Xie et al.'s epochs, one per round)",
    )


StalenessWeight = Literal["none", "inv_sqrt"]


class FedBuffParams(MethodParams):
    buffer_size: int = Field(10, ge=1, description="K, updates per flush")
    server_lr: float = Field(1.0, gt=0, description="η")
    staleness_weight: StalenessWeight = "none"
    per_round: bool = False


class FedBuffPerRoundParams(FedBuffParams):
    per_round: bool = True


class CA2FLParams(MethodParams):
    buffer_size: int = Field(10, ge=1, description="K, updates per flush")
    server_lr: float = Field(1.0, gt=0, description="η")


class DampParams(HookParams):
    mu: float = Field(0.01, ge=0, le=1, description="μ, the weight kept on the previous model")


class ClipStepParams(HookParams):
    max_norm: float = Field(1.0, gt=0, description="C, the largest L2 norm of one server step")


class CorruptParams(BehaviourParams):
    value: Literal["nan", "inf"] = "nan"


class ScaleParams(BehaviourParams):
    factor: float = Field(10.0, description="the delta is multiplied by this")


M = "raysim.algorithms.general."
SPECS = (
    MethodSpec("fedavg", M + "fedavg", reference="McMahan et al. 2017; feddle.md §4.2", sums=True),
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
        reference="Xie et al. 2019; feddle.md §4.3",
        asynchronous=True,
        each_because="each arrival is mixed into the model on its own, at a weight that its "
        "staleness sets, before the next one arrives",
    ),
    MethodSpec(
        "fedbuff",
        M + "fedbuff",
        FedBuffParams,
        reference="Nguyen et al. 2022; feddle.md §4.4",
        sums=True,
        asynchronous=True,
    ),
    MethodSpec(
        "fedbuff_per_round",
        M + "fedbuff",
        FedBuffPerRoundParams,
        reference="FedBuff flushed at every round end (K := |R_k|); feddle.md §4.4, I-4, I-6",
        sums=True,
    ),
    MethodSpec(
        "ca2fl",
        M + "ca2fl",
        CA2FLParams,
        reference="Wang et al. 2024 (CA2FL); feddle.md §4.5",
        asynchronous=True,
        each_because="it keeps each client's latest update as that client's calibration",
    ),
    HookSpec(
        "server hook",
        "damp",
        M + "mixers",
        DampParams,
        "fedbaf.md §2.6 (paper_damped FedProx server)",
    ),
    HookSpec(
        "server hook", "clip_step", M + "mixers", ClipStepParams, "norm bounding of the server step"
    ),
    HookSpec("client behaviour", "corrupt", M + "behaviours", CorruptParams, "fault injection"),
    HookSpec("client behaviour", "scale_update", M + "behaviours", ScaleParams, "update boosting"),
)
#: by name, for the implementation modules (``Method.of(METHODS["fedprox"], ...)``)
METHODS = {s.name: s for s in SPECS if isinstance(s, MethodSpec)}
HOOKS = {s.name: s for s in SPECS if isinstance(s, HookSpec)}
