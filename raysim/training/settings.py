"""How a client trains locally: the ``local:`` section of a config (a leaf module that the loop
and the backends both read, so neither imports the other for it)."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from raysim.schema import StrictModel


class DeepSpeedSettings(StrictModel):
    """DeepSpeed options for ``backend: deepspeed`` (one engine per local call)."""

    model_config = ConfigDict(frozen=True)

    zero_stage: Literal[0, 1, 2, 3] = Field(
        2,
        description="ZeRO stage: 0 none, 1 optimizer state, 2 also gradients, 3 also parameters "
        "partitioned",
    )
    offload_optimizer: bool = Field(
        False, description="optimizer state and step on the CPU (zero_stage 1 to 3)"
    )
    offload_params: bool = Field(
        False, description="parameters on the CPU between uses (zero_stage 3 only)"
    )

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> DeepSpeedSettings:
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("deepspeed.offload_params needs zero_stage 3")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("deepspeed.offload_optimizer needs zero_stage 1, 2 or 3")
        return self


#: the train metric counting a job's DP-SGD steps (the workers report it, the server accounts it)
DP_SGD_STEPS_METRIC = "dp_sgd_steps"


class DpSgdSettings(StrictModel):
    """Sample-level DP-SGD inside each client (Abadi et al. 2016, "Deep Learning with
    Differential Privacy", https://arxiv.org/abs/1607.00133; ``raysim.training.dp_sgd``): every
    example's gradient clipped to L2 norm ``clip``, the clipped sum noised with N(0, (z·clip)²)
    and divided by the batch's size, each step. The privacy unit is one example of a client's
    data; ε is accounted per client (``raysim.privacy.sample_level``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    clip: float = Field(
        1.0, gt=0, description="C_s, the L2 norm each example's gradient is clipped to"
    )
    noise_multiplier: float = Field(
        1.0, ge=0, description="z_s: the noise on a step's clipped sum has std z_s·C_s"
    )
    delta: float = Field(
        1e-5,
        gt=0,
        lt=1,
        description="δ of the per-client (ε, δ) guarantee (meaningful below 1/n for a client "
        "of n examples)",
    )


class LocalTrainingConfig(StrictModel):
    """How a client trains locally (identical for every method of a run)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    epochs: int = Field(
        1,
        ge=0,
        description="passes over the client's data per local call (sampling independent: as "
        "many steps as these passes would take)",
    )
    max_steps: int | None = Field(
        None,
        ge=0,
        description="stop after this many optimizer steps (e.g. a fraction of an epoch, FedBaF "
        "spec §4.4's E/λ); with sampling independent, exactly this many; None: no limit",
    )
    batch_size: int = Field(
        16, ge=1, description="examples per optimizer step (the effective batch)"
    )
    sampling: Literal["epochs", "independent"] = Field(
        "epochs",
        description="epochs: shuffled passes over the client's data (the last batch of a pass "
        "may be short); independent: every step draws batch_size distinct samples afresh "
        "(FedOT spec §3.5 'sample B examples'; a client with fewer samples uses them all)",
    )
    lr: float = Field(0.05, gt=0, description="the client optimizer's learning rate")
    optimizer: Literal["sgd", "adam", "adamw"] = Field(
        "sgd", description="the client optimizer, made afresh for every local call"
    )
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd: the momentum coefficient")
    weight_decay: float = Field(
        0.0, ge=0, description="L2 weight decay (adamw: decoupled, as torch's AdamW)"
    )
    backend: Literal["torch", "accelerate", "deepspeed"] = Field(
        "torch",
        description="what runs the optimizer steps: torch's own loop, Hugging Face Accelerate, "
        "or DeepSpeed (local.deepspeed)",
    )
    grad_accumulation: int = Field(
        1,
        ge=1,
        description="micro-batches per optimizer step (micro-batch = batch_size / this; it "
        "must divide batch_size)",
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        "no",
        description="autocast to bf16 or fp16 (fp16 with loss scaling); the torch backend "
        "applies it on a GPU only",
    )
    max_grad_norm: float | None = Field(
        None, gt=0, description="clip each step's gradient to this L2 norm; None: no clipping"
    )
    lr_schedule: Literal["constant", "linear"] = Field(
        "constant", description="linear: decay to 0 over each local call's steps, no warm-up"
    )
    absent_logits: Literal["keep", "zero", "neg_inf"] = Field(
        "keep",
        description="classification: logits of classes the client lacks are set to 0 or -inf "
        "in its loss (FedBaF spec §4.2; zero is the paper's literal reading)",
    )
    deepspeed: DeepSpeedSettings = Field(
        default_factory=DeepSpeedSettings, description="backend deepspeed: its ZeRO options"
    )
    dp_sgd: DpSgdSettings | None = Field(
        None,
        description="sample-level DP-SGD in every client's local training (None: off); needs "
        "sampling independent, backend torch, no fp16 and no max_grad_norm",
    )

    @model_validator(mode="after")
    def _micro_batch_divides(self) -> LocalTrainingConfig:
        if self.batch_size % self.grad_accumulation:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by grad_accumulation "
                f"{self.grad_accumulation} (micro-batch = batch_size // grad_accumulation)"
            )
        return self

    @model_validator(mode="after")
    def _dp_sgd_fits(self) -> LocalTrainingConfig:
        if self.dp_sgd is None:
            return self
        wrong = [
            (self.sampling != "independent", "local.sampling independent (each step samples "
             "batch_size examples afresh, the sampling its accountant analyses; shuffled epochs "
             "have no amplification analysis)"),
            (self.backend != "torch", "local.backend torch (it sets each step's gradient itself)"),
            (self.mixed_precision == "fp16", "local.mixed_precision no or bf16 (fp16's loss "
             "scaling rescales gradients after the clip)"),
            (self.max_grad_norm is not None, "no local.max_grad_norm (each example's gradient "
             "is clipped to local.dp_sgd.clip already)"),
        ]  # fmt: skip
        for bad, want in wrong:
            if bad:
                raise ValueError(f"local.dp_sgd needs {want}")
        return self

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accumulation


def total_optimizer_steps(n: int, cfg: LocalTrainingConfig) -> int:
    """Optimizer steps of one local call: epochs × ⌈n / batch_size⌉, at most ``max_steps``
    (with ``sampling: independent``, ``max_steps`` when set)."""
    if cfg.sampling == "independent" and cfg.max_steps is not None:
        return cfg.max_steps if n else 0
    steps = cfg.epochs * math.ceil(n / cfg.batch_size)
    return steps if cfg.max_steps is None else min(steps, cfg.max_steps)


def optimizer_steps(sizes: np.ndarray, cfg: LocalTrainingConfig) -> np.ndarray:
    """``total_optimizer_steps`` of every client at once (int64, one per size)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if cfg.sampling == "independent" and cfg.max_steps is not None:
        return np.where(sizes > 0, cfg.max_steps, 0).astype(np.int64)
    steps = cfg.epochs * (-(-sizes // cfg.batch_size))
    return steps if cfg.max_steps is None else np.minimum(steps, cfg.max_steps)
