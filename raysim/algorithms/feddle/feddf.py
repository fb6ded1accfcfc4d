"""FedDF-ID and FedDF-OOD (Lin et al. 2020) as Feddle spec §4.8 [O + I]: ensemble distillation on
the server.

Round end: the student starts from the FedAvg output (§4.2); the teachers are this round's client
models, ``feddf_teacher``: ``local_model`` (default, the model client j trained,
``ω^{k_j} + Δ_j``, A17) or ``transplanted`` (``ω^k + Δ_j``). The student minimises
``KL(softmax(mean_j f(ω_j, x)/T) || softmax(f(ω, x)/T))`` on unlabelled server inputs for
``server_epochs`` epochs of Adam (``server_lr``), T = 1 [O]; teacher logits are averaged [O]; no
early stopping. No arrival ⇒ the model is unchanged. The inputs are the in-distribution server set
(``feddf``, ``source: id``, labels unused) or this round's OOD sample (``feddf_ood``, ``source:
ood``: a fresh subset of ``ood_samples_per_round``, drawn as §3.5 draws Feddle-OOD's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..base import Method
from ..general.fedavg import RoundBuffer
from ..registry import register
from .params import METHODS, FedDFParams
from .server_training import (
    id_pool,
    ood_sample,
    train_on_server,
)


class FedDF(RoundBuffer):
    params: FedDFParams
    sums_updates = False  # each client's model is a teacher of its own

    def __init__(self, params, initial_weights, num_clients) -> None:
        super().__init__(params, initial_weights, num_clients)
        self.server_loss = float("nan")

    @torch.no_grad()
    def teacher_probs(self, x: torch.Tensor) -> torch.Tensor:
        """softmax(mean of the teachers' logits / T) on the server inputs (eval mode)."""
        handle, _ = self.ctx.model()
        total = None
        for u in self.pending:
            teacher = (
                u.local_weights
                if self.params.feddf_teacher == "local_model"
                else (self.weights + u.delta)
            )
            handle.set_global(teacher)
            handle.module.eval()
            logits = handle.module(x).double()
            total = logits if total is None else total + logits
        return F.softmax(total / len(self.pending) / self.params.temperature, dim=1).float()

    def inputs(self, round_index: int) -> torch.Tensor:
        """The unlabelled inputs the student is distilled on this round."""
        p = self.params
        if p.source == "id":
            return id_pool(self.ctx, "feddf").data[0]
        stream = f"feddf/ood/{round_index}"
        return ood_sample(self.ctx, p.ood_pool, p.ood_samples_per_round, stream, "feddf_ood")[1][0]

    def on_round_end(self, round_index: int) -> bool:
        delta = self.round_delta()
        if delta is None:
            return True
        x = self.inputs(round_index)
        probs = self.teacher_probs(x)
        self.pending = []
        handle, _ = self.ctx.model()
        t = self.params.temperature

        def kl(batch) -> torch.Tensor:
            xb, pb = batch
            log_q = F.log_softmax(handle.module(xb) / t, dim=1)
            return F.kl_div(log_q, pb, reduction="batchmean")

        student = self.weights + delta
        self.weights, m = train_on_server(
            self.ctx, student, (x, probs), self.params.recipe(), f"feddf/{round_index}", kl
        )
        self.server_loss = m["train_loss"]
        return True

    def metrics(self) -> dict[str, float]:
        return {"server_distill_loss": self.server_loss}


METHOD = register(Method.of(METHODS["feddf"], strategy=FedDF))


METHOD_OOD = register(Method.of(METHODS["feddf_ood"], strategy=FedDF))
