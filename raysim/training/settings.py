"""How a client trains locally: the ``local:`` section of a config (a leaf module that the loop
and the backends both read, so neither imports the other for it)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from raysim.schema import StrictModel


class DeepSpeedSettings(StrictModel):
    """DeepSpeed options for ``backend: deepspeed`` (one engine per local call)."""

    model_config = ConfigDict(frozen=True)

    zero_stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer: bool = False  # optimizer state and step on the CPU (ZeRO 1-3)
    offload_params: bool = False  # parameters on the CPU between uses (ZeRO 3 only)

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> DeepSpeedSettings:
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("deepspeed.offload_params needs zero_stage 3")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("deepspeed.offload_optimizer needs zero_stage 1, 2 or 3")
        return self


class LocalTrainingConfig(StrictModel):
    """How a client trains locally (identical for every method of a run)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    epochs: int = Field(1, ge=0)
    #: stop after this many optimizer steps (a fraction of an epoch, fedbaf.md §4.4's E/λ)
    max_steps: int | None = Field(None, ge=0)
    batch_size: int = Field(16, ge=1)  # the effective batch of one optimizer step
    sampling: Literal["epochs", "independent"] = Field(
        "epochs",
        description="epochs: shuffled passes over the client's data (the last batch of a pass "
        "may be short); independent: every step draws batch_size distinct samples afresh "
        "(fedot.md §3.5 'sample B examples'; a client with fewer samples uses them all)",
    )
    lr: float = Field(0.05, gt=0)
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    backend: Literal["torch", "accelerate", "deepspeed"] = "torch"
    grad_accumulation: int = Field(1, ge=1)  # micro-batch = batch_size // grad_accumulation
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    max_grad_norm: float | None = Field(None, gt=0)
    lr_schedule: Literal["constant", "linear"] = "constant"  # linear: to 0 within each call
    absent_logits: Literal["keep", "zero", "neg_inf"] = Field(
        "keep",
        description="classification: logits of classes the client lacks are set to 0 or -inf "
        "in its loss (fedbaf.md §4.2; zero is the paper's literal reading)",
    )
    deepspeed: DeepSpeedSettings = Field(default_factory=DeepSpeedSettings)

    @model_validator(mode="after")
    def _micro_batch_divides(self) -> LocalTrainingConfig:
        if self.batch_size % self.grad_accumulation:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by grad_accumulation "
                f"{self.grad_accumulation} (micro-batch = batch_size // grad_accumulation)"
            )
        return self

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accumulation
