"""Feddle's and its server-data baselines' parameters and specs (torch-free: a config is
checked against them before any model loads, ``raysim/algorithms/spec.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ...training.settings import LocalTrainingConfig
from ..general.params import StalenessWeight
from ..spec import MethodParams, MethodSpec, Needs

#: what the server-data methods need from a run (checked before Ray starts)
MINI = "examples/feddle/mini.yaml"


ID_DATA = Needs(server_id=True, example=MINI)


ID_CLASSIFIER = Needs(server_id=True, model=frozenset({"classifier"}), example=MINI)


OOD_CLASSIFIER = Needs(ood_pool=True, model=frozenset({"classifier"}), example=MINI)


class ServerTrainingParams(MethodParams):
    """The server's own optimiser (Feddle spec §4.1, §4.6, §4.8: Adam [I]; batch 32, A11)."""

    server_lr: float = Field(1e-3, gt=0, description="the server optimiser's learning rate")
    server_epochs: int = Field(
        1, ge=0, description="passes over the server data each time the server trains"
    )
    server_batch_size: int = Field(32, ge=1, description="server examples per step (A11)")
    server_optimizer: Literal["adam", "sgd"] = Field(
        "adam", description="the server's optimiser, made afresh for every call"
    )

    def recipe(self) -> LocalTrainingConfig:
        return LocalTrainingConfig(
            epochs=self.server_epochs,
            batch_size=self.server_batch_size,
            lr=self.server_lr,
            optimizer=self.server_optimizer,
        )


class CenterParams(ServerTrainingParams):
    server_lr: float = Field(3e-3, gt=0, description="Feddle spec §8.1: Adam 3e-3")
    server_epochs: int = Field(50, ge=0, description="Feddle spec §8.1: 50 epochs")


class FedFTParams(ServerTrainingParams):
    base_aggregator: Literal["fedavg", "fedbuff_per_round"] = Field(
        "fedavg",
        description="the aggregation before the server's fine-tuning: fedavg (Feddle spec §4.2) "
        "or fedbuff_per_round (A15)",
    )


class FedDFParams(ServerTrainingParams):
    temperature: float = Field(1.0, gt=0, description="T of the distillation softmax")
    feddf_teacher: Literal["local_model", "transplanted"] = Field(
        "local_model",
        description="each teacher: the model the client trained, ω^{k_j} + Δ_j, or its delta "
        "on the current model, ω^k + Δ_j (Feddle spec §4.8, A17)",
    )
    source: Literal["id", "ood"] = Field(
        "id",
        description="distil on the in-distribution server samples (data.server.id_size) or on "
        "an out-of-domain pool (data.server.ood)",
    )
    ood_pool: str | None = Field(None, description="which data.server.ood pool (default: first)")
    ood_samples_per_round: int | None = Field(
        1000, ge=1, description="OOD inputs per round, a fresh subset; None: the whole pool (A12)"
    )


class FedDFOODParams(FedDFParams):
    source: Literal["id", "ood"] = Field(
        "ood",
        description="distil on an out-of-domain pool (data.server.ood) or on the "
        "in-distribution server samples (data.server.id_size)",
    )


class FeddleParams(MethodParams):
    atlas_size: int | None = Field(
        None,
        ge=1,
        description="M, anchors (client deltas) kept; None: 2·S, e.g. 20 for S = 10 (Feddle "
        "spec §3.1)",
    )
    eviction: Literal["importance", "fifo"] = Field(
        "importance",
        description="which anchor a new one replaces in a full atlas: the lowest importance "
        "|ĉ_m| of the last search, or the oldest (fifo, the ablation's Base; Feddle spec §3.2)",
    )
    new_anchor_score: Literal["protect", "inherit"] = Field(
        "protect",
        description="a new anchor's score until its first search: protect (never evicted "
        "before it) or inherit the evicted one's (Algorithm 1 literally; Feddle spec §3.2, A6)",
    )
    normalize: Literal["median", "none"] = Field(
        "median",
        description="rescale every anchor to the median of their norms before a search (Eq. "
        "5, Feddle spec §3.3), or none",
    )
    fallback_init: Literal["fedbuff", "zero"] = Field(
        "fedbuff",
        description="where the coefficient search starts: c' that reproduces FedBuff's step, "
        "or 0 (Feddle spec §3.6)",
    )
    fallback_scope: Literal["new_arrivals", "whole_atlas"] = Field(
        "new_arrivals",
        description="the anchors c' steps FedBuff-style on: this round's arrivals, or the whole "
        "atlas as the buffer (Feddle spec §3.6, A8)",
    )
    fallback_norm_correction: bool = Field(
        True,
        description="c' in the normalised basis, so that it reproduces FedBuff's step exactly; "
        "false: η_fb·w(τ)/|N_k| (Feddle spec §3.6)",
    )
    fallback_lr: float = Field(
        1.0,
        gt=0,
        description="η_fb, the server lr of the FedBuff step c' reproduces (Feddle spec §3.6)",
    )
    staleness_weight: StalenessWeight = Field(
        "none", description="w(τ) in c': none (1) or inv_sqrt, 1/√(1+τ) (Feddle spec A9)"
    )
    mode: Literal["id", "ood"] = Field(
        "id",
        description="the server's data: id, labelled in-distribution samples (data.server."
        "id_size, Feddle spec §3.4); ood, an out-of-domain pool and a probe head (§3.5)",
    )
    lam: float | None = Field(
        None, ge=0, description="λ, tie to c' (Eq. 11); default 0 for ID (§3.4), 0.01 for OOD"
    )
    ood_pool: str | None = Field(None, description="which data.server.ood pool (default: first)")
    ood_samples_per_round: int | None = Field(
        1000, ge=1, description="a fresh random subset each round; None: the whole pool (A12)"
    )
    theta_init: Literal["warm", "fresh"] = Field(
        "warm",
        description="ood: the probe head θ, kept from round to round or made afresh each round "
        "(Feddle spec §3.5, A13)",
    )
    theta_epochs: int = Field(
        1, ge=1, description="ood: epochs that fit the probe head each round (Feddle spec A13)"
    )
    theta_lr: float = Field(
        1e-3, gt=0, description="ood: the probe head's Adam learning rate (Feddle spec A13)"
    )
    log_gradient_cosine: bool = Field(
        True, description="cos(∇_c h, ∇_c ℓ) when OOD and ID server data both exist (Fig. 7)"
    )
    server_lr: float = Field(
        1e-3, gt=0, description="η_g, the coefficient search's learning rate (Feddle spec §3.7)"
    )
    server_epochs: int = Field(
        10,
        ge=0,
        description="E_g, passes of the search over the server data per round; 0: no search, "
        "the fallback step alone (Feddle spec invariant I-6)",
    )
    server_batch_size: int = Field(
        32, ge=1, description="server examples per search step (Feddle spec A11)"
    )
    coef_optimizer: Literal["adam", "sgd"] = Field(
        "adam", description="the coefficients' optimiser, made afresh every round (Feddle spec A10)"
    )
    tie_step: Literal["explicit", "proximal"] = Field(
        "explicit",
        description="SGD's step on the tie (λ/2)‖c − c'‖²: explicit (its gradient, Eq. 11 as "
        "written) or proximal (exact; stable for any λ; search.SearchConfig)",
    )
    search_trigger: Literal["every_round", "on_new_arrivals"] = Field(
        "every_round",
        description="search every round with a non-empty atlas, or only in rounds with new "
        "arrivals (Feddle spec A5; the earlier name new_arrivals still reads)",
    )
    bn_buffers: Literal["fallback_mean", "fedavg_models", "freeze"] = Field(
        "fallback_mean",
        description="BatchNorm statistics, which are no anchors: plus the mean of the arriving "
        "buffer deltas, the sample-weighted mean of the arriving models', or frozen (Feddle spec "
        "§3.1, A14)",
    )
    log_server_loss: bool = Field(True, description="server loss before and after the search")
    log_flops: bool = Field(True, description="the search's FLOPs per round (Table 6)")

    @field_validator("search_trigger", mode="before")
    @classmethod
    def _spec_name(cls, value: object) -> object:
        return "on_new_arrivals" if value == "new_arrivals" else value

    @model_validator(mode="after")
    def _stable_tie(self) -> FeddleParams:
        """With SGD the tie's explicit step multiplies c − c' by 1 − η_g·λ each step: at
        η_g·λ ≥ 2 it grows without bound (a NaN model), so such settings are refused."""
        explicit = self.coef_optimizer == "sgd" and self.tie_step == "explicit"
        if explicit and self.server_lr * self.tie >= 2:
            raise ValueError(
                f"server_lr · lam = {self.server_lr * self.tie:g} ≥ 2: the SGD coefficient "
                "search's tie to c' diverges; lower server_lr or lam, or set tie_step proximal"
            )
        return self

    @property
    def tie(self) -> float:
        """λ, with the spec's per-mode default (§3.4: 0 for ID; §3.5: 0.01 for OOD)."""
        return self.lam if self.lam is not None else (0.0 if self.mode == "id" else 0.01)


class FeddleOODParams(FeddleParams):
    mode: Literal["id", "ood"] = Field(
        "ood",
        description="the server's data: ood, an out-of-domain pool (data.server.ood) and a "
        "probe head (Feddle spec §3.5); id, labelled in-distribution samples (§3.4)",
    )


M = "raysim.algorithms.feddle."
SPECS = (
    MethodSpec(
        "center",
        M + "center",
        CenterParams,
        ID_DATA,
        "Feddle spec §4.1",
        each_because="it trains on the server only: no client sends anything",
    ),
    MethodSpec("fedft", M + "fedft", FedFTParams, ID_DATA, "Fed+FT; Feddle spec §4.6", sums=True),
    MethodSpec(
        "hfcl",
        M + "hfcl",
        needs=ID_DATA,
        reference="Elbir et al. 2021; Feddle spec §4.7",
        sums=True,
    ),
    MethodSpec(
        "feddf",
        M + "feddf",
        FedDFParams,
        ID_CLASSIFIER,
        "Lin et al. 2020 (FedDF-ID); Feddle spec §4.8",
        each_because="each client's model is a teacher of its own in the distillation",
    ),
    MethodSpec(
        "feddf_ood",
        M + "feddf",
        FedDFOODParams,
        OOD_CLASSIFIER,
        "Lin et al. 2020 (FedDF-OOD), on the OOD server pool; Feddle spec §4.8",
        each_because="each client's model is a teacher of its own in the distillation",
    ),
    MethodSpec(
        "feddle",
        M + "method",
        FeddleParams,
        ID_DATA,
        "Feddle (federated dual learning), in-domain server data; Feddle spec §3",
        asynchronous=True,
        each_because="each arrival may become an anchor of the atlas the server searches",
    ),
    MethodSpec(
        "feddle_ood",
        M + "method",
        FeddleOODParams,
        OOD_CLASSIFIER,
        "Feddle with out-of-domain server data (a probe surrogate); Feddle spec §3.5",
        asynchronous=True,
        each_because="each arrival may become an anchor of the atlas the server searches",
    ),
)
#: by name, for the implementation modules (``Method.of(METHODS["feddle"], ...)``)
METHODS = {s.name: s for s in SPECS}
