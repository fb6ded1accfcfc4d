"""FedSDR as the FedOA authors ran it (Tang et al., ICLR 2024, "Learning personalized causally
invariant representations for heterogeneous federated clients"); FedOA spec §3.6.

This is the **authors' surrogate, not the original CMI estimator**: no shortcut extractor is trained
and no conditional mutual information is estimated. The global adapter, trained FedIT-style, plays
the shortcut extractor; the personal adapter is trained on ``CE + λ·R_SDR`` with

    R_SDR = (1/B) Σ_b |⟨e_b, |g_b − ḡ|⟩|,

e_b = the personal adapter's last-token final-layer feature, g_b = the teacher's (round-start
global adapter, no grad) feature on the same micro-batch, ḡ = the mean of g_b over the micro-batch,
|·| inside element-wise. The classifier-head regulariser of FedSDR is dropped (fixed LLM head).
Everything else is FedOA's client (``personal.py``): personal phase then the exactly-FedIT
global phase, FedAvg server, the personal adapter persists and answers for a known client.

Switches (defaults first): ``lambda`` (alias ``lam``) 0.5 (= the authors' ``regular_weight``);
as FedOA (FedOA spec §2.4, §2.8): ``feature_layer`` −1, ``feature_pool`` last, ``teacher_dropout``
false, ``personal_init`` fresh | copy_global, ``personal_start_round`` 0 (paper) | 1 (code),
``order``, ``global_update_mode``, ``train_global``; ``log_feature_distance`` true, whose
``distance`` (l2) only shapes that logged diagnostic.
"""

from __future__ import annotations

import torch

from ..base import Method
from ..general.fedavg import FedAvg
from ..registry import register
from .params import METHODS, FedSDRParams
from .personal import PERSONAL, PERSONAL_GROUPS, FedOAClient


def sdr_regularizer(e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """R_SDR = (1/B) Σ_b |⟨e_b, |g_b − ḡ|⟩| for (B, d) student ``e`` and teacher ``g``."""
    g = g.detach()
    shift = (g - g.mean(dim=0, keepdim=True)).abs()
    return (e * shift).sum(dim=1).abs().mean()


class FedSDRClient(FedOAClient):
    params: FedSDRParams

    def regularizer(self, e: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return sdr_regularizer(e, g)


METHOD = register(
    Method.of(
        METHODS["fedsdr"],
        strategy=FedAvg,
        client=FedSDRClient,
        groups=PERSONAL_GROUPS,
        evaluate_with=PERSONAL,
    )
)
