"""Two evaluation views on a plain module, as the worker-side evaluator tests load them.

``head``: the body is averaged and the last layer stays with each client (FedPer-style,
Arivazhagan et al. 2019); a known client is evaluated through its own head.
``tune``: FedAvg whose clients fine-tune ``tune_epochs`` epochs on their own data before they
are evaluated (the shape of FedOT spec §5's L-FedAvg, shortened).
"""

from __future__ import annotations

from raysim.algorithms import ClientAlgorithm, Method, MethodParams, register
from raysim.algorithms.general.fedavg import FedAvg
from raysim.models.layout import ParamGroup
from raysim.training.loop import train_local

HEAD_GROUPS = (ParamGroup("body", "shared"), ParamGroup("head", "personal", r"^3\."))


class HeadClient(ClientAlgorithm):
    def train(self, ctx):
        model = ctx.model
        params = model.group_parameters("body") + model.group_parameters("head")
        return train_local(model.module, params, ctx.task, ctx.data, ctx.config, ctx.generator)


class TuneParams(MethodParams):
    tune_epochs: int = 1


class TuneClient(ClientAlgorithm):
    params: TuneParams

    def adapt(self, ctx):
        cfg = ctx.config.model_copy(update={"epochs": self.params.tune_epochs})
        params = ctx.model.global_parameters()
        train_local(ctx.model.module, params, ctx.task, ctx.data, cfg, ctx.generator)


HEAD = register(
    Method(
        name="head",
        strategy=FedAvg,
        client=HeadClient,
        reference="tests",
        groups=HEAD_GROUPS,
        evaluate_with="head",
    )
)
TUNE = register(
    Method(name="tune", strategy=FedAvg, params=TuneParams, client=TuneClient, reference="tests")
)
