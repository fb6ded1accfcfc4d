"""FedLoRA as adapted by the FedOA paper (Yi et al. 2023, "FedLoRA: model-heterogeneous
personalized federated learning with LoRA tuning"); FedOA spec §3.4.

The paper's adaptation: run FedIT; a client's personalised LoRA is the globally aggregated LoRA
further fine-tuned on the client's data with CE, used for testing, never persisted across rounds
and never uploaded. Per round, client e:
(a) personal adapter θ_e ← the global adapter it downloaded (φ_g^{t-1}), then ``finetune_epochs``
    epochs of CE on its data (own RNG stream ``personal``); θ_e is stored as the client's personal
    state (only so the runtime can evaluate it: it is rebuilt from the global every round);
(b) the client's copy of φ_g, K epochs of plain CE (exactly FedIT), uploaded.

[I] deviation: the spec fine-tunes the *current* global φ_g^t whenever a personal model is needed;
the runtime evaluates a client's stored state, so here θ_e = FT(φ_g^{t-1}), a one-round lag (after
the last round, the personal models start from the global the clients downloaded in that round,
not from the final aggregate). Unsampled clients keep their last θ_e.

Switches (defaults first): ``finetune_epochs`` K_ft = 2 [proposal; not reported]; ``personal_from``
downloaded (the only option implemented; names the lag above).
"""

from __future__ import annotations

from ...training.loop import train_local
from ..base import ClientAlgorithm, ClientContext, Method
from ..general.fedavg import FedAvg
from ..registry import register
from .params import METHODS, FedLoRAParams
from .personal import GLOBAL, PERSONAL, PERSONAL_GROUPS, task_loss


class FedLoRAClient(ClientAlgorithm):
    params: FedLoRAParams

    def train_personal(self, ctx: ClientContext) -> dict[str, float]:
        """θ_e ← downloaded φ_g, then ``finetune_epochs`` epochs of CE."""
        h = ctx.model
        h.set_adapter(PERSONAL, h.get_adapter(GLOBAL))
        h.use(PERSONAL)
        cfg = ctx.config.model_copy(update={"epochs": self.params.finetune_epochs})
        m = train_local(
            h.module,
            h.adapter_parameters(PERSONAL),
            ctx.task,
            ctx.data,
            cfg,
            ctx.phase(PERSONAL),
            objective=task_loss(ctx),
        )
        return {"personal_train_loss": m["train_loss"]} if m["local_steps"] else {}

    def train(self, ctx: ClientContext) -> dict[str, float]:
        h = ctx.model
        metrics = self.train_personal(ctx)
        h.use(GLOBAL)
        params = h.adapter_parameters(GLOBAL)
        generator = ctx.phase(None)  # the job's own streams: the global path is exactly FedIT's
        metrics.update(train_local(h.module, params, ctx.task, ctx.data, ctx.config, generator))
        return metrics


METHOD = register(
    Method.of(
        METHODS["fedlora"],
        strategy=FedAvg,
        client=FedLoRAClient,
        groups=PERSONAL_GROUPS,
        evaluate_with=PERSONAL,
    )
)
