"""The torch-free half of methods and hooks: their parameters, what they need from a run, and
where their implementation lives.

A config is checked against these before Ray starts, in the driver and in every Tune trial, so
this module and every built-in ``params`` module (one per paper package) load without torch. The
implementation modules, which do import torch, are imported only where a method or hook is
built (``registry.get_method``, ``Registry.get``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pydantic import ConfigDict, Field, model_validator

from ..schema import StrictModel

if TYPE_CHECKING:
    from ..training.settings import LocalTrainingConfig


class MethodParams(StrictModel):
    """Hyper-parameters of a method (server and client side); subclasses add fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def trains_together(self) -> bool:
        """Whether a round's clients must train in one ``train_together`` call, coupled step by
        step (FedOT's exact centring, FedOT spec §3.3). The runtime then sends a round's jobs to
        one worker as one batch, each client on its own copy of the model. Override it on the
        params class, so that the config can tell before any model loads."""
        return False


class HookParams(MethodParams):
    """Parameters of a hook; subclasses add fields."""


class BehaviourParams(HookParams):
    """Which jobs a client behaviour applies to: listed clients, or a fixed random fraction ζ of
    them (None for both: all), in listed dispatch rounds (None: all)."""

    clients: list[int] | None = Field(None, description="client ids (None: every client)")
    fraction: float | None = Field(
        None,
        ge=0,
        le=1,
        description="ζ: round(ζ·K) clients drawn once from the run seed (FedBaF spec §4.4)",
    )
    rounds: list[int] | None = Field(None, description="dispatch rounds (None: every round)")

    @model_validator(mode="after")
    def _one_selector(self) -> BehaviourParams:
        if self.clients is not None and self.fraction is not None:
            raise ValueError("give clients or fraction, not both")
        return self


@dataclass(frozen=True)
class Needs:
    """What a method needs from a run, checked against the config before Ray starts.

    ``model``: traits the model must have (``raysim/models/registry.py`` gives each model its
    traits: ``lora``, ``causal_lm``, ``classifier``, ``token_lm``); ``server_id``: labelled
    in-distribution server data (``data.server.id_size``); ``ood_pool``: an out-of-domain server
    pool (``data.server.ood``); ``example``: a config that shows how to give it all.
    """

    model: frozenset[str] = frozenset()
    """Traits the model must have (``raysim methods`` lists each model's)."""
    server_id: bool = False
    """Labelled in-distribution server data (``data.server.id_size``)."""
    ood_pool: bool = False
    """An out-of-domain server pool (``data.server.ood``)."""
    plain_sgd: bool = False
    """Local steps taken by hand as plain SGD: no momentum, weight decay or accumulation."""
    example: str = ""
    """A config that shows how to give it all (the refusal names it)."""

    def unmet(
        self,
        method: str,
        model: str,
        traits: set[str],
        id_size: int,
        pools: int,
        local: LocalTrainingConfig | None = None,
    ) -> str:
        """One line naming what is missing and what to set; "" when the run has it all."""
        problem = ""
        wrong = self._not_plain_sgd(local) if self.plain_sgd and local is not None else []
        if wrong:
            problem = f"{method} steps plain SGD by hand: set {', '.join(wrong)}"
        elif self.model and not self.model <= traits:
            want = " ".join(sorted(self.model))
            have = ", ".join(sorted(traits)) or "none of them"
            problem = (
                f"{method} needs a model with traits [{want}]; model {model!r} has {have}: "
                "set model.name"
            )
        elif self.server_id and id_size <= 0:
            problem = f"{method} needs in-distribution server data: set data.server.id_size"
        elif self.ood_pool and pools == 0:
            problem = f"{method} needs an out-of-domain server pool: set data.server.ood"
        if problem and self.example:
            problem += f" ({self.example} shows how)"
        return problem

    @staticmethod
    def _not_plain_sgd(local: LocalTrainingConfig) -> list[str]:
        """The ``local.KEY VALUE`` settings that plain, hand-taken SGD steps need and lack."""
        want = {
            "optimizer": "sgd",
            "momentum": 0.0,
            "weight_decay": 0.0,
            "backend": "torch",
            "grad_accumulation": 1,
        }
        return [f"local.{k} {v}" for k, v in want.items() if getattr(local, k) != v]

    def describe(self) -> str:
        """For ``raysim methods``: what the method needs, or "any model"."""
        parts = [f"model: {'+'.join(sorted(self.model))}"] if self.model else []
        parts += ["server ID data"] * self.server_id + ["OOD pool"] * self.ood_pool
        parts += ["plain SGD"] * self.plain_sgd
        return ", ".join(parts) or "any model"


@dataclass(frozen=True)
class MethodSpec:
    """What a config needs to know of a method before any model loads.

    ``module`` registers the implementation (``Method.of(spec, ...)``); ``batchable``: whether
    its client can train in a batched pass (``ClientAlgorithm.may_batch``, checked when the
    method registers); ``secrets``: whether its strategy declares server-private values
    (overrides ``Strategy.secrets``, checked when it registers), which turns the leak auditor on
    by default (``audit.leaks``); ``sums``: whether its server step reads the clients' deltas only
    as a weighted sum (``Strategy.sums_updates``, checked when it registers), which lets the
    workers sum them where they are (``workers.partial_sums``); ``each_because``: where it does
    not, why it needs each delta (``raysim methods`` and the refusal of ``partial_sums: on``
    say it); ``own_training``: whether its client trains outside the default local loop, so
    that ``local.dp_sgd`` is refused for it before Ray starts.
    """

    kind: ClassVar[str] = "algorithm"
    """The registry's word for a method, as in its errors."""
    name: str
    """The name a config gives it (``algorithm.name``)."""
    module: str
    """The module whose import registers its implementation."""
    params: type[MethodParams] = MethodParams
    """Its parameters class (torch-free)."""
    needs: Needs = Needs()
    """What it needs from a run."""
    reference: str = ""
    """The paper (and section) it implements."""
    batchable: bool = True
    """Whether its client can train in a batched pass (``ClientAlgorithm.may_batch``)."""
    secrets: bool = False
    """Whether its strategy declares server-private values (overrides ``Strategy.secrets``)."""
    sums: bool = False
    """Whether its server step reads the deltas only as a weighted sum
    (``Strategy.sums_updates``)."""
    each_because: str = "its strategy does not declare sums_updates"
    """Where it does not sum, why it needs each delta."""
    own_training: bool = False
    """Its client trains its own way (``ClientAlgorithm.trains_privately`` is False), which
    sample-level DP-SGD (``local.dp_sgd``) does not cover; checked when it registers."""
    partial_work: bool = False
    """With devices (``devices.partial_work: auto``): a client that cannot finish its local work
    by a round's deadline sends the steps it did (FedProx, Li et al. 2020 §3: "variable
    amount of work") instead of being dropped."""
    asynchronous: bool = False
    """With devices (``devices.late: auto``): an update done after its round closed arrives in a
    later round, stale (an asynchronous method), instead of being dropped."""

    @property
    def updates(self) -> str:
        """For ``raysim methods``: how its clients' deltas reach the server step."""
        if self.sums:
            return "summed where they are (workers.partial_sums)"
        return f"each one whole: {self.each_because}"


@dataclass(frozen=True)
class HookSpec:
    """What a config needs to know of a mixer or a client behaviour: ``kind`` is the registry's
    (``"server hook"`` or ``"client behaviour"``), ``module`` registers the implementation;
    ``secrets``: a mixer that declares server-private values (overrides ``Mixer.secrets``);
    ``forges``: a client behaviour whose updates the server forges from the round's benign ones
    (overrides ``ClientBehaviour.forge``: the updates then travel whole, ``raysim.robust``)."""

    kind: str
    """The registry's word: ``"server hook"`` or ``"client behaviour"``."""
    name: str
    """The name a config gives it (a ``hooks.server`` or ``hooks.clients`` entry's ``name``)."""
    module: str
    """The module whose import registers its implementation (``Hook.of(spec, cls)``)."""
    params: type[HookParams] = HookParams
    """Its parameters class (torch-free)."""
    reference: str = ""
    """The paper (and section) it comes from."""
    secrets: bool = False
    """A mixer that declares server-private values (overrides ``Mixer.secrets``)."""
    forges: bool = False
    """A client behaviour whose updates the server forges (overrides
    ``ClientBehaviour.forge``)."""
