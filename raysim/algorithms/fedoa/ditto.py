"""Ditto (Li et al. 2021, "Ditto: fair and robust federated learning through personalization");
FedOA spec §3.7 (extra baseline; the paper cites it as parameter regularisation). Runs on any model:
on a causal LM φ_g and v are two LoRA adapters; on a plain module φ_g is the module's trainable
tensors and v a personal copy of them (``ModelHandle``; BatchNorm statistics stay shared).

Per round, client e (same two-phase structure as FedOA, FedOA spec §2.3):
(a) personal model v, K epochs of ``L(v; ξ) + (λ/2) Σ_tensors ‖v − φ_g^{t-1}‖²``; the prox
    centre is the *round-start* global model, fixed for the whole phase (no gradient to it);
(b) the client's copy of φ_g, K epochs of the plain task loss (exactly FedIT / FedAvg, same RNG
    stream), uploaded.
The server is FedAvg; v never leaves the client and persists across rounds; v answers for a known
client (``evaluate_with = personal``).

Switches (defaults first): ``lambda`` (alias ``lam``) 0.1 [proposal; Ditto tunes λ per task];
``personal_init`` fresh (FedOA spec §2.8 default) | copy_global; ``personal_start_round`` 0 (paper)
| 1 (authors' code); ``order`` personal_first | global_first; ``global_update_mode`` local_epochs |
single_full_grad_step; ``train_global`` true; ``log_feature_distance`` true (the Fig. 2 diagnostic,
on a causal LM only; ``distance``/``feature_layer``/``feature_pool``/``teacher_dropout`` only shape
that diagnostic). Every round also logs ``param_distance`` = ‖v − φ_g^{t-1}‖₂ (flat vectors). With λ
= 0 the personal trajectory is Local-only's bit for bit (invariant I18).
"""

from __future__ import annotations

import numpy as np

from ...training.batched import train_batched, unbatchable
from ...training.penalties import Proximal
from ...training.tasks import CausalLMTask
from ..base import ClientContext, Method, Snapshot
from ..general.fedavg import FedAvg
from ..registry import register
from .params import METHODS, DittoParams
from .personal import (
    GLOBAL,
    PERSONAL,
    PERSONAL_GROUPS,
    ParamProxClient,
    squared_distance,
)


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

    # ------------------------------------------------ workers.execution: batched
    def unbatchable(self, ctxs):
        """Ditto batches on a plain module with its default schedule: both phases run as
        batched passes, the personal copies stacked like the global tensors."""
        p, first = self.params, ctxs[0]
        if isinstance(first.task, CausalLMTask):
            return "Ditto's two LoRA adapters are not batched yet"
        if p.order != "personal_first" or p.global_update_mode != "local_epochs":
            return "only order personal_first with global_update_mode local_epochs batches"
        if not first.model.switches_groups:
            return "its personal group is not a swapped-in copy"
        return unbatchable(first.model, first.task, [c.config for c in ctxs], personal=True)

    def train_batched(self, model, ctxs, starts: list[Snapshot]):
        """Both phases of ``train`` for the whole group: (a) the personal copies on the task
        loss plus (λ/2)‖v − φ_g^{t-1}‖², on ``ctx.phase(PERSONAL)``'s streams; (b) the global
        group on the task loss, on the jobs' own streams."""
        p, first = self.params, ctxs[0]
        out: list[Snapshot] = [{} for _ in ctxs]
        metrics: list[dict[str, float]] = [{} for _ in ctxs]
        for i, (c, s) in enumerate(zip(ctxs, starts, strict=True)):
            if c.first_visit and p.personal_init == "copy_global":
                s[PERSONAL] = out[i][PERSONAL] = [t.clone() for t in s[GLOBAL]]
        centre = [t.detach().clone() for t in starts[0][GLOBAL]]  # the same round-start global
        datas = [c.data for c in ctxs]

        def phase(group: str, stream: str | None, penalty=None):
            model.use(group)
            streams = [c.phase(stream) for c in ctxs]
            own = [s[group] for s in starts]
            params = model.group_parameters(group)
            return train_batched(
                model, own, first.task, datas, first.config, streams, penalty, params=params
            )

        if first.dispatch_round >= p.personal_start_round:
            penalty = None
            if p.lam:
                penalty = Proximal(p.lam, centre)
            finals, m = phase(PERSONAL, PERSONAL, penalty)
            start = np.concatenate([t.reshape(-1).numpy() for t in centre]).astype(np.float64)
            for i, f in enumerate(finals):
                out[i][PERSONAL] = f
                own = np.concatenate([t.reshape(-1).numpy() for t in f])
                metrics[i]["personal_train_loss"] = m[i]["train_loss"]
                metrics[i]["param_distance"] = float(np.linalg.norm(own.astype(np.float64) - start))
        if p.train_global:
            finals, m = phase(GLOBAL, None)
            for i, f in enumerate(finals):
                out[i][GLOBAL] = f
                metrics[i].update(m[i])
        model.use(GLOBAL)
        return out, metrics


METHOD = register(
    Method.of(
        METHODS["ditto"],
        strategy=FedAvg,
        client=DittoClient,
        groups=PERSONAL_GROUPS,
        evaluate_with=PERSONAL,
    )
)
