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
    distance: Distance = Field(
        "l2",
        description="D between personal and teacher features (FedOA spec §2.5): l2 is "
        "‖E − G‖_F over a micro-batch (the authors' code); l2_squared, l2_mean, mse, cosine, "
        "pearson, l1. ditto, perada, fedsdr: only the logged feature_distance",
    )
    feature_layer: int = Field(
        -1,
        description="the hidden state whose features are compared, an index into the model's "
        "hidden states; −1: the last, the head's input (FedOA spec §2.4)",
    )
    feature_pool: Pool = Field(
        "last",
        description="a sequence's features (FedOA spec §2.4): last, its last real token; mean "
        "over non-pad tokens; response_mean over the answer's tokens; token: every non-pad one",
    )
    personal_init: Literal["fresh", "copy_global"] = Field(
        "fresh",
        description="the personal model at a client's first visit: fresh (its own "
        "initialisation; a new LoRA adapter equals the base model) or copy_global (FedOA spec "
        "§2.8)",
    )
    personal_start_round: int = Field(
        0,
        ge=0,
        description="the first dispatch round the personal model trains in: 0 (the paper) or 1 "
        "(the authors' code; FedOA spec §2.8)",
    )
    teacher_dropout: bool = Field(
        False,
        description="keep dropout on in the teacher's forward pass (the authors' code); false: "
        "the teacher runs in eval mode (FedOA spec §2.8)",
    )
    order: Literal["personal_first", "global_first"] = Field(
        "personal_first",
        description="which phase of a client's round runs first; the teacher is the round-start "
        "global adapter either way (FedOA spec §2.3)",
    )
    global_update_mode: Literal["local_epochs", "single_full_grad_step"] = Field(
        "local_epochs",
        description="local_epochs: the global copy trains as FedIT does (local.epochs of "
        "minibatches); single_full_grad_step: one full-batch gradient step, Algorithm 1 line 10 "
        "read literally (FedOA spec §2.3)",
    )
    train_global: bool = Field(
        True,
        description="train the client's global copy and upload it; false: only the personal "
        "phase runs, the upload is the downloaded model",
    )
    log_feature_distance: bool = Field(
        True,
        description="log feature_distance, the mean D between the personal and the global "
        "features over the client's data (FedOA spec §4.8, Fig. 2; causal LMs only)",
    )

    model_config = {"populate_by_name": True}


class LocalOnlyParams(FedOAParams):
    lam: float = Field(
        0.0, ge=0, le=0, alias="lambda", description="λ, always 0: the personal model trains alone"
    )


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
    personal_init: Literal["fresh", "copy_global"] = Field(
        "fresh",
        description="θ at a client's first visit: fresh (its own initialisation) or "
        "copy_global (the global model)",
    )
    authors_code: bool = Field(
        False,
        description="the FedOA authors' code's pFedMe (FedOA spec §3.3, §2.13): from round 1 a "
        "gradient-free penalty on θ, then one data-free step of the global copy",
    )

    model_config = {"populate_by_name": True}

    @property
    def lambda_p(self) -> float:
        if self.lam is not None:
            return self.lam
        return CODE_LAMBDA if self.authors_code else STANDARD_LAMBDA


class FedLoRAParams(MethodParams):
    finetune_epochs: int = Field(2, ge=0, description="K_ft: CE epochs of personal fine-tuning")
    personal_from: Literal["downloaded"] = Field(
        "downloaded",
        description="the personal adapter is fine-tuned from the global one the client "
        "downloaded this round (a round behind the new aggregate; the only choice)",
    )


class PeradaParams(FedOAParams):
    lam: float = Field(0.5, ge=0, alias="lambda", description="λ_p of λ_p Σ‖v − φ_g‖²")
    prox_on: Literal["factors", "delta_W"] = Field(
        "factors",
        description="the prox term on the LoRA A and B tensors separately, or on each module's "
        "product BA (delta_W, an ablation)",
    )
    squared: bool = Field(
        True, description="squared norms (PerAda's code); false: plain L2 norms, safe at 0"
    )
    param_prox_detached: bool = Field(
        False,
        description="the authors' code's gradient-free penalty λ_p Σ‖θ_p − θ_g‖₂ / 32 (FedOA spec "
        "§2.13): the personal model trains as Local-only's; prox_on and squared ignored",
    )


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
        "Yang et al. 2025, FedOA; FedOA spec §2",
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
