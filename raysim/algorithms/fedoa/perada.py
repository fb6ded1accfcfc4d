"""PERADA without distillation (Xie et al., CVPR 2024, "PerAda: parameter-efficient federated
learning personalization with generalization guarantees"); FedOA spec §3.5 and §2.13.

As the FedOA paper runs it, PERADA minus the server-side distillation is Ditto on adapters. Per
round, client e:
(a) personal adapter v, K epochs of ``CE(v; ξ) + λ_p Σ_tensors ‖v − φ_g^{t-1}‖²`` (PerAda's code:
    squared norm summed over the LoRA tensors, no 1/2), the prox centre being the *round-start*
    global adapter, fixed (no gradient to it);
(b) the client's copy of φ_g, K epochs of plain CE (exactly FedIT), uploaded.
The server is FedAvg (no distillation). v persists on the client and answers for a known client.

Switches (defaults first):
- ``lambda`` (alias ``lam``) λ_p = 0.5 [proposal = the authors' ``regular_weight``; not reported];
- ``prox_on`` factors (A and B tensors separately; the "structural heterogeneity" FedOA criticises)
  | delta_W (``Σ_modules ‖B_v A_v − B_w A_w‖²``, an ablation; the LoRA scaling α/r is left out);
- ``squared`` true | false (un-squared: ``λ_p Σ ‖·‖₂`` per tensor / per module, safe at 0);
- ``param_prox_detached`` false | true: the authors'-code form (§2.13), ``λ_p Σ_tensors
  ‖θ_p − θ_g‖₂ / 32`` added as a Python float, so it adds *no gradient* and the personal trajectory
  is Local-only's (invariant I21); ``prox_on``/``squared`` are then ignored;
- ``personal_init`` fresh (FedOA spec §2.8 default; PerAda itself copies the global) | copy_global;
- ``personal_start_round`` 0 (paper) | 1 (authors' code);
- as FedOA: ``order``, ``global_update_mode``, ``train_global``, ``log_feature_distance`` (the
  Fig. 2 diagnostic; ``distance``/``feature_*``/``teacher_dropout`` only shape that diagnostic).
Each round logs ``param_distance`` = ‖v − φ_g^{t-1}‖₂ (flat vectors).
"""

from __future__ import annotations

import torch

from ..base import ClientContext, Method
from ..general.fedavg import FedAvg
from ..registry import register
from .params import METHODS, PeradaParams
from .personal import (
    GLOBAL,
    PERSONAL,
    PERSONAL_GROUPS,
    ParamProxClient,
    detached_code_penalty,
    squared_distance,
)

_TINY = 1e-24


def lora_pairs(module: torch.nn.Module, adapter: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(A, B) weight pairs of ``adapter``, one per LoRA module, in module order (from the names
    ``<prefix>.lora_A.<adapter>.weight`` / ``<prefix>.lora_B.<adapter>.weight``)."""
    a_key, b_key = f".lora_A.{adapter}.weight", f".lora_B.{adapter}.weight"
    named = dict(module.named_parameters())
    pairs = []
    for name, a in named.items():
        if name.endswith(a_key):
            pairs.append((a, named[name[: -len(a_key)] + b_key]))
    if not pairs:
        raise ValueError(f"no LoRA modules for adapter {adapter!r}")
    return pairs


def _norm(x: torch.Tensor) -> torch.Tensor:
    """‖x‖₂ with a zero (finite) gradient at x = 0."""
    return torch.sqrt((x * x).sum().clamp_min(_TINY))


class PeradaClient(ParamProxClient):
    params: PeradaParams

    def penalty_fn(self, ctx: ClientContext):
        p, h = self.params, ctx.model
        lam = p.lam
        if lam == 0:
            return None
        personal = h.adapter_parameters(PERSONAL)
        centre = [q.detach().clone() for q in h.adapter_parameters(GLOBAL)]
        if p.param_prox_detached:
            return lambda: lam * detached_code_penalty(personal, centre)
        if p.prox_on == "factors":
            if p.squared:
                return lambda: lam * squared_distance(personal, centre)
            return lambda: lam * sum(_norm(v - c) for v, c in zip(personal, centre, strict=True))
        pairs = lora_pairs(h.module, PERSONAL)
        with torch.no_grad():
            targets = [(b @ a).detach().clone() for a, b in lora_pairs(h.module, GLOBAL)]

        def delta_w() -> torch.Tensor:
            diffs = [b @ a - t for (a, b), t in zip(pairs, targets, strict=True)]
            if p.squared:
                return lam * sum((d * d).sum() for d in diffs)
            return lam * sum(_norm(d) for d in diffs)

        return delta_w


METHOD = register(
    Method.of(
        METHODS["perada"],
        strategy=FedAvg,
        client=PeradaClient,
        groups=PERSONAL_GROUPS,
        evaluate_with=PERSONAL,
    )
)
