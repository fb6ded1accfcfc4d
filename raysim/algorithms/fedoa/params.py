"""FedOA's and its personalised-adapter baselines' parameters and specs (torch-free: a
config is checked against them before any model loads, ``raysim/algorithms/spec.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..spec import MethodParams, MethodSpec, Needs

Pool = Literal["last", "mean", "response_mean", "token"]


Distance = Literal["l2", "l2_squared", "l2_mean", "mse", "cosine", "pearson", "l1"]


#: what the adapter methods need: per-layer hidden states or LoRA A/B factors of a causal LM
LORA_LM = Needs(model=frozenset({"lora", "causal_lm"}), example="examples/fedoa/mini.yaml")


class FedOAParams(MethodParams):
    lam: float = Field(0.5, ge=0, alias="lambda", description="λ, weight of D (FedOA spec §2.2)")
    distance: Distance = "l2"
    feature_layer: int = -1
    feature_pool: Pool = "last"
    personal_init: Literal["fresh", "copy_global"] = "fresh"
    personal_start_round: int = Field(0, ge=0)
    teacher_dropout: bool = False
    order: Literal["personal_first", "global_first"] = "personal_first"
    global_update_mode: Literal["local_epochs", "single_full_grad_step"] = "local_epochs"
    train_global: bool = True
    log_feature_distance: bool = True

    model_config = {"populate_by_name": True}


class LocalOnlyParams(FedOAParams):
    lam: float = Field(0.0, ge=0, le=0, alias="lambda")


class DittoParams(FedOAParams):
    lam: float = Field(0.1, ge=0, alias="lambda", description="λ of (λ/2)‖v − φ_g‖² [proposal]")


#: pFedMe's λ: the paper's standard value, and the FedOA authors' code's (FedOA spec §3.3)
STANDARD_LAMBDA, CODE_LAMBDA = 15.0, 0.5


class PFedMeParams(MethodParams):
    lam: float | None = Field(
        None, ge=0, alias="lambda", description="λ_p; None = 15 (standard) or 0.5 (authors_code)"
    )
    inner_steps: int = Field(5, ge=1, description="K_in inner steps per minibatch")
    beta: float = Field(1.0, gt=0, description="server mixing β; 1 = FedAvg")
    lr_personal: float | None = Field(None, gt=0, description="η_p; None = local.lr")
    lr_global: float | None = Field(None, gt=0, description="η; None = local.lr")
    personal_init: Literal["fresh", "copy_global"] = "fresh"
    authors_code: bool = False

    model_config = {"populate_by_name": True}

    @property
    def lambda_p(self) -> float:
        if self.lam is not None:
            return self.lam
        return CODE_LAMBDA if self.authors_code else STANDARD_LAMBDA


class FedLoRAParams(MethodParams):
    finetune_epochs: int = Field(2, ge=0, description="K_ft: CE epochs of personal fine-tuning")
    personal_from: Literal["downloaded"] = "downloaded"


class PeradaParams(FedOAParams):
    lam: float = Field(0.5, ge=0, alias="lambda", description="λ_p of λ_p Σ‖v − φ_g‖²")
    prox_on: Literal["factors", "delta_W"] = "factors"
    squared: bool = True
    param_prox_detached: bool = False


class FedSDRParams(FedOAParams):
    lam: float = Field(0.5, ge=0, alias="lambda", description="λ, weight of R_SDR")


M = "raysim.algorithms.fedoa."
SPECS = (
    MethodSpec("fedit", M + "fedit", reference="Zhang et al. 2023; FedOA spec §3.2", sums=True),
    MethodSpec(
        "fedoa",
        M + "method",
        FedOAParams,
        LORA_LM,
        "FedOA (seeds 000/001); FedOA spec §2",
        False,
        sums=True,
        own_training=True,
    ),
    MethodSpec(
        "local_only",
        M + "method",
        LocalOnlyParams,
        reference="Local-only personal models = FedOA with λ = 0; FedOA spec §3.7",
        batchable=False,
        sums=True,
        own_training=True,
    ),
    MethodSpec(
        "ditto",
        M + "ditto",
        DittoParams,
        reference="Li et al. 2021 (Ditto); FedOA spec §3.7",
        sums=True,
        own_training=True,
    ),
    MethodSpec(
        "perada",
        M + "perada",
        PeradaParams,
        LORA_LM,
        "Xie et al. 2024 (PerAda), without distillation; FedOA spec §3.5",
        False,
        sums=True,
        own_training=True,
    ),
    MethodSpec(
        "pfedme",
        M + "pfedme",
        PFedMeParams,
        reference="T. Dinh et al. 2020 (pFedMe); FedOA spec §3.3",
        batchable=False,
        sums=True,
        own_training=True,
    ),
    MethodSpec(
        "fedlora",
        M + "fedlora",
        FedLoRAParams,
        LORA_LM,
        "Yi et al. 2023 (FedLoRA) as adapted by FedOA; FedOA spec §3.4",
        False,
        sums=True,
        own_training=True,
    ),
    MethodSpec(
        "fedsdr",
        M + "fedsdr",
        FedSDRParams,
        LORA_LM,
        "Tang et al. 2024 (FedSDR), the FedOA authors' surrogate; FedOA spec §3.6",
        False,
        sums=True,
        own_training=True,
    ),
    MethodSpec(
        "centralized",
        M + "centralized",
        reference="Centralized: FedIT on one client holding all data, T=1, K=10; FedOA spec §3.1",
        sums=True,
    ),
)
#: by name, for the implementation modules (``Method.of(METHODS["fedoa"], ...)``)
METHODS = {s.name: s for s in SPECS}
