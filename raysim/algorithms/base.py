"""The two halves of a federated method: a server ``Strategy`` and a ``ClientAlgorithm``.

Nothing here knows about Ray or MLflow. The coordinator (``raysim/actors``) calls a strategy through
``on_arrival`` / ``on_round_end`` in virtual-clock order (feddle.md §2.3); a worker calls a client
algorithm's ``train`` for every virtual client it runs. Weights cross this boundary as one flat
float32 numpy vector of the model's trainable parameters, in ``model.parameters()`` order.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import ConfigDict

from ..models.handle import ModelHandle
from ..schema import StrictModel
from ..training.loop import LocalTrainingConfig, train_local
from ..training.tasks import Task


class MethodParams(StrictModel):
    """Hyper-parameters of a method (server and client side); subclasses add fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Update:
    """One client's report, as the server sees it when the virtual clock delivers it.

    ``delta`` = local weights after training − ``base`` (the global weights the client downloaded,
    version ``dispatch_version``). Staleness counters follow feddle.md §2.4.
    """

    client_id: int
    delta: np.ndarray
    num_samples: int
    dispatch_round: int
    dispatch_version: int
    arrival_time: float
    arrival_round: int
    tau_versions: int
    base: np.ndarray
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def tau_rounds(self) -> int:
        """Rounds between dispatch and delivery (= ⌊d⌋ with floor rounding)."""
        return self.arrival_round - self.dispatch_round

    @property
    def local_weights(self) -> np.ndarray:
        """The model the client actually trained: ω^{k_j} + Δ_j."""
        return self.base + self.delta


class Strategy:
    """Server side of a method: owns the global weights and every piece of server state.

    The coordinator bumps the model version when ``on_arrival``/``on_round_end`` return True.
    Never modify ``self.weights`` in place: assign a new array (published versions are shared).
    """

    def __init__(self, params: MethodParams, initial_weights: np.ndarray, num_clients: int) -> None:
        self.params = params
        self.weights = np.array(initial_weights, dtype=np.float32, copy=True)
        self.num_clients = num_clients

    def on_arrival(self, update: Update) -> bool:
        """Receive one update in arrival order; return True if the global model changed."""
        return False

    def on_round_end(self, round_index: int) -> bool:
        """Called once at the end of every round; return True if the global model changed."""
        return False

    def metrics(self) -> dict[str, float]:
        """Server-side diagnostics to log after each round."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume; numpy arrays allowed as values."""
        return {"weights": self.weights}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.weights = np.array(state["weights"], dtype=np.float32, copy=True)


PenaltyFn = Callable[[Sequence[torch.Tensor]], torch.Tensor]


@dataclass
class ClientContext:
    """Everything one virtual client's local work may use (built by the worker per job)."""

    model: ModelHandle
    task: Task
    data: Any
    config: LocalTrainingConfig
    generator: torch.Generator
    client_id: int
    dispatch_round: int
    first_visit: bool = False  # no personal state yet (the model's fresh init was loaded)
    seed: int = 0  # the job seed; ``generator`` and torch's global RNG start from it

    def phase(self, name: str | None) -> torch.Generator:
        """Restart the RNGs for one phase of local work and return its shuffling generator.

        ``None`` restores exactly the job's own streams (what a single-phase method such as FedIT
        sees); a name gives an independent stream, so phases do not perturb each other.
        """
        seed = self.seed
        if name is not None:
            seed = int(
                np.random.SeedSequence([self.seed, zlib.crc32(name.encode())]).generate_state(1)[0]
            )
        torch.default_generator.manual_seed(seed)
        return torch.Generator().manual_seed(seed)


class ClientAlgorithm:
    """Client side of a method: the local objective and what is sent up.

    The default trains the global parameters on the task loss with the configured optimiser;
    subclasses add a ``penalty`` (e.g. FedProx's proximal term) or override ``train`` entirely
    (e.g. methods that also train personal state). ``train`` leaves the model holding the local
    result: the worker reads the update from ``model.get_global()`` and the new personal state from
    ``model.get_state()``.
    """

    def __init__(self, params: MethodParams) -> None:
        self.params = params

    def penalty(self, global_params: Sequence[torch.Tensor]) -> PenaltyFn | None:
        """A term added to the local loss, given the downloaded global parameters; None = none."""
        return None

    def train(self, ctx: ClientContext) -> dict[str, float]:
        params = ctx.model.global_parameters()
        penalty = None
        if type(self).penalty is not ClientAlgorithm.penalty:  # snapshot only when needed
            penalty = self.penalty([p.detach().clone() for p in params])
        return train_local(
            ctx.model.module, params, ctx.task, ctx.data, ctx.config, ctx.generator, penalty
        )


class WeightedMean:
    """Fixed-order weighted sum of deltas: the one reduction every aggregator shares.

    Using one helper makes methods that coincide in theory (FedBuff with K = S vs FedAvg) coincide
    bit for bit too.
    """

    @staticmethod
    def combine(deltas: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
        out = np.zeros_like(deltas[0], dtype=np.float32)
        for d, w in zip(deltas, weights, strict=True):
            out += np.float32(w) * d
        return out


@dataclass(frozen=True)
class Method:
    """A registered method: its name, seed paper/spec section, and its two halves."""

    name: str
    strategy: type[Strategy]
    params: type[MethodParams] = MethodParams
    client: type[ClientAlgorithm] = ClientAlgorithm
    reference: str = ""
    adapters: tuple[str, ...] = ("global",)  # adapter sets on the resident model; [0] is global
    #: Which adapter answers for a known client (intra-client OOD and ID; fedoa.md §2.9). The
    #: global adapter always answers for a new client (inter-client OOD).
    eval_adapter: str = "global"
    tags: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def build_client(self, params: Mapping[str, Any]) -> ClientAlgorithm:
        return self.client(self.params(**params))

    def build_strategy(
        self, params: Mapping[str, Any], initial_weights: np.ndarray, num_clients: int
    ) -> Strategy:
        return self.strategy(self.params(**params), initial_weights, num_clients)
