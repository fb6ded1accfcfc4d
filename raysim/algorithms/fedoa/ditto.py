"""Ditto (Li et al. 2021, "Ditto: fair and robust federated learning through personalization");
fedoa.md §3.7 (extra baseline; the paper cites it as parameter regularisation). Runs on any model:
on a causal LM φ_g and v are two LoRA adapters; on a plain module φ_g is the module's trainable
tensors and v a personal copy of them (``ModelHandle``; BatchNorm statistics stay shared).

Per round, client e (same two-phase structure as FedOA, fedoa.md §2.3):
(a) personal model v, K epochs of ``L(v; ξ) + (λ/2) Σ_tensors ‖v − φ_g^{t-1}‖²``; the prox
    centre is the *round-start* global model, fixed for the whole phase (no gradient to it);
(b) the client's copy of φ_g, K epochs of the plain task loss (exactly FedIT / FedAvg, same RNG
    stream), uploaded.
The server is FedAvg; v never leaves the client and persists across rounds; v answers for a known
client (``evaluate_with = personal``).

Switches (defaults first): ``lambda`` (alias ``lam``) 0.1 [proposal; Ditto tunes λ per task];
``personal_init`` fresh (spec §2.8 default) | copy_global; ``personal_start_round`` 0 (paper) | 1
(authors' code); ``order`` personal_first | global_first; ``global_update_mode`` local_epochs |
single_full_grad_step; ``train_global`` true; ``log_feature_distance`` true (the Fig. 2 diagnostic,
on a causal LM only; ``distance``/``feature_layer``/``feature_pool``/``teacher_dropout`` only shape
that diagnostic). Every round also logs ``param_distance`` = ‖v − φ_g^{t-1}‖₂ (flat vectors).
With λ = 0 the personal trajectory is Local-only's bit for bit (invariant I18).
"""

from __future__ import annotations

from pydantic import Field

from ..base import ClientContext, Method
from ..general.fedavg import FedAvg
from ..registry import register
from .personal import (
    GLOBAL,
    PERSONAL,
    PERSONAL_GROUPS,
    FedOAParams,
    ParamProxClient,
    squared_distance,
)


class DittoParams(FedOAParams):
    lam: float = Field(0.1, ge=0, alias="lambda", description="λ of (λ/2)‖v − φ_g‖² [proposal]")


class DittoClient(ParamProxClient):
    params: DittoParams

    def penalty_fn(self, ctx: ClientContext):
        lam = self.params.lam
        if lam == 0:
            return None
        h = ctx.model
        centre = [p.detach().clone() for p in h.adapter_parameters(GLOBAL)]
        personal = h.adapter_parameters(PERSONAL)
        return lambda: 0.5 * lam * squared_distance(personal, centre)


METHOD = register(
    Method(
        name="ditto",
        strategy=FedAvg,
        params=DittoParams,
        client=DittoClient,
        groups=PERSONAL_GROUPS,
        evaluate_with=PERSONAL,
        reference="Li et al. 2021 (Ditto); fedoa.md §3.7",
    )
)
