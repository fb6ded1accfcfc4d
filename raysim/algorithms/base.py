"""The two halves of a federated method: a server ``Strategy`` and a ``ClientAlgorithm``.

Nothing here knows about Ray or MLflow. The coordinator (``raysim/actors``) calls a strategy through
``configure`` / ``on_arrival`` / ``on_round_end`` in virtual-clock order (Feddle spec §2.3); a
worker calls a client algorithm's ``train`` for every virtual client it runs. Weights cross this
boundary as one flat float32 numpy vector: the shared parameter group, then the model's buffers,
as the ``Layout`` in ``ServerContext.layout`` describes. ``docs/architecture.md`` maps every hook.
"""

from __future__ import annotations

import inspect
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import Diverged as Diverged  # re-exported: a strategy raises it
from ..models.layout import DEFAULT_GROUPS, ParamGroup, check_groups
from ..models.registry import ModelWrapper
from .context import ServerContext
from .exact_sum import HeldDelta, combine
from .private import REFUSAL, PrivateStateError, PrivateTensors, private_array
from .spec import MethodParams as MethodParams  # re-exported: the torch-free half lives in spec
from .spec import MethodSpec
from .spec import Needs as Needs

if TYPE_CHECKING:  # the server half loads without torch; the client half imports it where it runs
    import torch

    from ..models.handle import ModelHandle
    from ..training.backends import PenaltyFn
    from ..training.settings import LocalTrainingConfig
    from ..training.tasks import Task

Snapshot = dict[str, list["torch.Tensor"]]
"""One client's parameter groups as tensors: group name → its tensors in group order
(``ClientAlgorithm.train_batched``)."""


@dataclass(frozen=True)
class Update:
    """One client's report, as the server sees it when the virtual clock delivers it.

    ``delta`` = local weights after training − ``base`` (the global weights the client downloaded,
    version ``dispatch_version``). Staleness counters follow Feddle spec §2.4.
    """

    client_id: int
    """The client that trained it."""
    delta: np.ndarray
    """Its local weights after training minus ``base``: a flat float32 vector in the order of
    ``ServerContext.layout`` (the shared parameters, then the buffers). A ``HeldDelta`` instead
    where the strategy sets ``sums_updates`` and the workers sum (``workers.partial_sums``)."""
    num_samples: int
    """How many training examples the client holds (the usual aggregation weight)."""
    dispatch_round: int
    """The round in which the client was dispatched and downloaded ``base``."""
    dispatch_version: int
    """The version of the global model it downloaded (``base``)."""
    arrival_time: float
    """When the virtual clock delivers it, in rounds."""
    arrival_round: int
    """The round in which the server receives it."""
    tau_versions: int
    """Staleness in model versions: how often the global model changed between its dispatch and
    its delivery (a hook that returns True makes a new version)."""
    base: np.ndarray
    """The global weights the client downloaded (version ``dispatch_version``)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """The client's metrics: what its ``ClientAlgorithm.train`` returned (``train_loss``,
    ``local_steps``, ...), with any the run adds (``local_accuracy``)."""
    extras: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Named extra tensors the client sent up (``ClientContext.upload``)."""

    @property
    def tau_rounds(self) -> int:
        """Rounds between dispatch and delivery (= ⌊d⌋ with floor rounding)."""
        return self.arrival_round - self.dispatch_round

    @property
    def local_weights(self) -> np.ndarray:
        """The model the client actually trained: ω^{k_j} + Δ_j."""
        return self.base + self.delta


@dataclass(frozen=True)
class Secret:
    """Values of one tensor block the server must never send: their flat indices in the global
    vector and the values. Held by the coordinator's auditor, in the server's process only.
    ``shape``: the block's shape, its values in row-major order (the auditor then also looks for
    a 2-D block's transpose); None where the values are no tensor of their own."""

    name: str
    """The block's name, as the auditor reports a leak of it."""
    indices: np.ndarray
    """Its values' flat indices in the global vector."""
    values: np.ndarray
    """The values, kept as a read-only ``PrivateArray`` that refuses to be pickled."""
    shape: tuple[int, ...] | None = None
    """The block's shape (its values in row-major order), or None."""

    def __post_init__(self) -> None:
        # the auditor's own copy of the block: a ``PrivateArray``, which refuses to be pickled
        # (a closure that captures it, or the Secret, fails instead of shipping the values)
        object.__setattr__(self, "values", private_array(self.values))

    def __reduce__(self):  # noqa: D105
        raise PrivateStateError(REFUSAL)


class Stateful:
    """Default checkpointing for server-side objects: every attribute but the context.

    ``state_dict`` returns the instance's attributes except ``params``, ``ctx``, those named in
    ``transient`` (rebuilt by ``setup``) and any ``PrivateTensors`` (never written; see
    ``private_state``). Override both methods for a leaner or versioned format.
    """

    transient: tuple[str, ...] = ()
    """Attributes rebuilt by ``setup`` on every start and resume, never checkpointed."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume; numpy arrays, lists, dicts and ``Update``s allowed."""
        skip = {"params", "ctx", *self.transient}
        return {
            k: v
            for k, v in vars(self).items()
            if k not in skip and not isinstance(v, PrivateTensors)
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned (on resume, after ``setup``): each entry
        becomes an attribute again."""
        for k, v in state.items():
            setattr(self, k, v)

    def private_state(self) -> dict[str, np.ndarray]:
        """Private arrays that ``setup`` cannot rebuild; written to the server's checkpoint only
        (its own file, never the pickled part) and given back to ``load_private_state``."""
        return {}

    def load_private_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore what ``private_state`` wrote (on resume, after ``setup``). The default keeps
        none and refuses any."""
        if arrays:
            raise ValueError(f"{type(self).__name__} keeps no private state to restore")


@dataclass(frozen=True)
class Downlink:
    """What a strategy sends with one round's jobs besides the weights (``Strategy.configure``).

    ``tensors`` go to every client dispatched that round (published once); ``per_client`` adds
    tensors for single clients. Both are counted in ``bytes_down``.
    """

    tensors: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Named arrays for every client dispatched that round (published once)."""
    per_client: Mapping[int, Mapping[str, np.ndarray]] = field(default_factory=dict)
    """Client id → named arrays for that client alone (over ``tensors`` of the same name)."""

    def for_client(self, client: int) -> dict[str, np.ndarray]:
        """What ``client`` receives as ``ClientContext.downlink``: ``tensors``, then its own
        ``per_client`` entries."""
        return {**self.tensors, **self.per_client.get(client, {})}

    def nbytes(self, client: int) -> int:
        """The bytes ``client`` receives (counted in ``bytes_down``)."""
        return sum(a.nbytes for a in self.for_client(client).values())


class Strategy(Stateful):
    """Server side of a method: owns the global weights and every piece of server state.

    Life cycle: ``__init__(params, initial_weights, num_clients)``, then ``setup(ctx)`` (on a fresh
    run and on resume, where ``load_state_dict`` follows). Per round: ``configure`` at dispatch,
    ``on_arrival`` per delivered update in virtual-clock order, ``on_round_end``. The coordinator
    bumps the model version when ``on_arrival``/``on_round_end`` return True. Never modify
    ``self.weights`` in place: assign a new array (published versions are shared).
    """

    uses_clients: bool = True
    """False for a server-only method (Center): the coordinator then dispatches no client."""
    stop_on_nonfinite: bool = False
    """True: a non-finite client update stops the run (``Diverged``) instead of being rejected
    with a warning (for methods where a NaN means divergence, not one faulty client)."""
    sums_updates: bool = False
    """True: the server step reads its clients' deltas only through ``WeightedMean.combine``,
    with weights from what an ``Update`` says besides its delta (sizes, staleness), so the
    workers may keep the deltas and sum them where they are (``workers.partial_sums``;
    ``Update.delta`` is then a ``HeldDelta``). False: each delta reaches the server whole.
    A method's spec says the same (``MethodSpec.sums``), checked when it registers."""
    sums_each_round: bool = True
    """True: one sum a round, over that round's arrivals, taken at ``on_round_end`` (what
    differential privacy's Poisson analysis assumes: a round that sampled no client then
    releases noise alone); False: sums at other times (FedBuff's full buffer)."""
    stop_reason: str | None = None
    """Why the run ends before its planned rounds, as a finished run, where the strategy says
    so (a privacy budget spent); None: it runs them all."""

    def __init__(self, params: MethodParams, initial_weights: np.ndarray, num_clients: int) -> None:
        self.params = params
        """The method's parameters (its ``MethodParams`` subclass, from the config)."""
        self.weights = np.array(initial_weights, dtype=np.float32, copy=True)
        """The global model: a flat float32 vector in the order of ``ServerContext.layout``.
        Assign a new array, never modify it in place (published versions are shared)."""
        self.num_clients = num_clients
        """K, the number of clients in the run."""

    def setup(self, ctx: ServerContext) -> None:
        """Take the server context (random streams, layout, server model and data, metric sink).

        Build server-only resources here (they must not be pickled: list them in ``transient``)."""
        self.ctx = ctx

    def configure(self, round_index: int, clients: Sequence[int]) -> Downlink | None:
        """What the clients dispatched in ``round_index`` receive besides the weights."""
        return None

    def on_arrival(self, update: Update) -> bool:
        """Receive one update in arrival order; return True if the global model changed."""
        return False

    def on_round_end(self, round_index: int) -> bool:
        """Called once at the end of every round; return True if the global model changed."""
        return False

    def updates_per_aggregation(self, clients_per_round: int) -> int:
        """How many updates one of its sums expects: differential privacy's fixed denominator
        (``raysim.privacy``). A round's clients by default (a sum per round)."""
        return clients_per_round

    def secrets(self) -> list[Secret]:
        """Server-private values no payload to a client may carry (checked by the leak auditor
        when ``audit.leaks`` is on); none by default."""
        return []

    def private_artifacts(self) -> list[Secret]:
        """Server-private values the user asked to log (the run is then tagged restricted);
        none by default."""
        return []

    def metrics(self) -> dict[str, float]:
        """Server-side diagnostics to log after each round."""
        return {}

    def notices(self) -> list[str]:
        """Lines the run should show and keep (``warnings.txt``) before its first round: a
        setting that is allowed but known to misbehave; none by default."""
        return []

    reads_client_states: bool = False
    """True: ``state_metrics`` is called after each round with every client's personal state
    (a simulator's check of what a real server could not see; it reads them all: O(clients))."""

    def state_metrics(self, states: Mapping[int, Mapping[str, np.ndarray]]) -> dict[str, float]:
        """Diagnostics computed from the personal states of the clients that have one (by
        client id) after a round, where ``reads_client_states``; logged with its metrics."""
        return {}

    def tables(self) -> dict[str, list[dict[str, float]]]:
        """Named tables the run saves at its end as ``strategy/NAME.csv`` artifacts (per-round
        detail that does not fit one scalar per round, e.g. Feddle's coefficients)."""
        return {}


@dataclass
class ClientContext:
    """Everything one virtual client's local work may use (built by the worker per job)."""

    model: ModelHandle
    """The resident model (a ``ModelHandle``), loaded with the global weights this job received
    and the client's personal state; train it in place."""
    task: Task
    """How ``data`` is batched and its loss computed (a ``Task``)."""
    data: Any
    """The client's training data, in the form ``task`` takes (as a client behaviour left it)."""
    config: LocalTrainingConfig
    """The local-training settings (the config's ``local`` section: ``lr``, ``epochs``,
    ``batch_size``, ...), as a client behaviour or a device's partial work (``max_steps``) left
    them for this job."""
    generator: torch.Generator
    """The job's shuffling generator, seeded with ``seed``."""
    client_id: int
    """The virtual client this job trains."""
    dispatch_round: int
    """The round in which this job was dispatched."""
    first_visit: bool = False
    """True on the client's first job: no personal state yet (personal groups hold the values
    the model was built with, and ``state`` is empty)."""
    seed: int = 0
    """The job seed, a function of (run seed, client id, dispatch round): ``generator`` and
    torch's global RNG start from it, and ``phase`` derives others from it."""
    downlink: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Tensors the strategy sent with this job (``Strategy.configure``)."""
    uplink: dict[str, np.ndarray] = field(default_factory=dict)
    """Tensors this job sends up besides the delta (filled by ``upload``)."""
    received: np.ndarray | None = None
    """The global weights this job received (what a curious client can record)."""
    state: dict[str, Any] = field(default_factory=dict)
    """This client's own named arrays that are no model parameter (SCAFFOLD's control variate,
    FedDyn's linear term, running statistics): empty on the first visit, loaded before
    ``train`` and saved after it, kept with the client's personal state (checkpointed, safe
    from a killed worker, the same in pooled and per-client modes) and never sent to the
    server; ``upload`` what the server should see. numpy or torch values (bf16 is kept as
    fp32)."""

    def upload(self, name: str, value: np.ndarray | torch.Tensor) -> None:
        """Send a named extra tensor up with this job's update (``Update.extras``)."""
        import torch

        if isinstance(value, torch.Tensor):
            value = value.detach().float().cpu().numpy()
        self.uplink[name] = np.array(value, copy=True)

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
        import torch

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
        """The method's parameters (its ``MethodParams`` subclass). One instance serves every
        client a worker runs, so nothing of one job may be kept on it for the next."""

    def penalty(self, global_params: Sequence[torch.Tensor]) -> PenaltyFn | None:
        """A term added to the local loss, given the downloaded global parameters; None = none."""
        return None

    def adapt(self, ctx: ClientContext) -> torch.nn.Module | None:
        """Before this client is evaluated: change its view of the model in place (for example
        fine-tune on ``ctx.data``, FedOT spec §5's L-FedAvg and Fed-FOMAML), or return a module
        that answers instead of the resident one (an ensemble: FedMI's output mixture).
        Overriding it makes every client evaluate its own adapted copy; the default keeps the
        model as it is."""
        return None

    @property
    def trains_together(self) -> bool:
        """Whether a round's clients train in one ``train_together`` call: the params say
        (``MethodParams.trains_together``)."""
        return self.params.trains_together

    def train_together(self, ctxs: Sequence[ClientContext]) -> list[dict[str, float]]:
        """Train the clients of one round together when ``trains_together``; each context holds
        its own copy of the model. The default trains them one after another."""
        return [self.train(ctx) for ctx in ctxs]

    def train_batched(
        self, model: ModelHandle, ctxs: Sequence[ClientContext], starts: Sequence[Snapshot]
    ) -> tuple[list[Snapshot], list[dict[str, float]]]:
        """``workers.execution: batched``: a group of clients trained together, one pass per
        step (``raysim.training.batched``). ``starts[i]`` holds client i's tensors of every
        parameter group as loaded (group name → tensors); returns, per client, the groups it
        trained (the rest stay as loaded) and its metrics. The default is the default ``train``:
        the global group on the task loss plus an optional ``penalty``."""
        from ..training.batched import train_batched

        group = model.groups[0].name
        first = starts[0][group]
        penalty = None
        if type(self).penalty is not ClientAlgorithm.penalty:  # every client got this global
            penalty = self.penalty([t.detach().clone() for t in first])
        c = ctxs[0]
        finals, metrics = train_batched(
            model,
            [s[group] for s in starts],
            c.task,
            [x.data for x in ctxs],
            [x.config for x in ctxs],  # they may differ in max_steps (devices' partial work)
            [x.generator for x in ctxs],
            penalty,
        )
        return [{group: f} for f in finals], metrics

    @classmethod
    def state_nbytes(cls, params: MethodParams) -> int:
        """Bytes of ``ClientContext.state`` one client keeps between its visits, as far as
        ``params`` tell (0: none, or not known before the run). The plan counts them in the
        run's memory and in ``clients.state.store: auto``'s choice of memory or disk, which
        cannot see a plugin's state otherwise (``raysim.launch.sizes``)."""
        return 0

    @classmethod
    def trains_privately(cls) -> bool:
        """Whether ``local.dp_sgd`` covers all of this client's training: it trains through
        the default ``train`` only (``raysim.training``'s local loop, on the task's loss, whose
        DP-SGD clips each example's gradient). A client with its own ``train`` that reaches its
        data through ``train_local`` alone, with no ``objective``, may override this to say so.
        A built-in method's spec says the same (``MethodSpec.own_training``), for the config."""
        return cls.train is ClientAlgorithm.train and (
            cls.train_together is ClientAlgorithm.train_together
        )

    @classmethod
    def may_batch(cls) -> bool:
        """Whether ``train_batched`` can train this client at all: the default ``train``, or
        its own ``train_batched``."""
        return cls.train_batched is not ClientAlgorithm.train_batched or (
            cls.train is ClientAlgorithm.train
        )

    def unbatchable(self, ctxs: Sequence[ClientContext]) -> str:
        """Why ``train_batched`` cannot train these clients ("" when it can): they then train
        one after another."""
        if type(self).train is not ClientAlgorithm.train:
            return f"{type(self).__name__} trains its own way (it overrides train)"
        from ..training.batched import unbatchable

        return unbatchable(ctxs[0].model, ctxs[0].task, [c.config for c in ctxs])

    def train(self, ctx: ClientContext) -> dict[str, float]:
        """One client's local work: train ``ctx.model`` in place and return the job's metrics.

        The worker calls it once per job, with the model loaded with the global weights the job
        received and the client's personal state. Leave the model holding the result: the
        update is ``ctx.model.get_global()`` minus those weights (a flat float32 vector of the
        size of ``ServerContext.layout``: the shared group, then the buffers) and the new
        personal state is ``ctx.model.get_state()``; ``ctx.state`` is saved as ``train`` left
        it, and what it ``ctx.upload``-ed goes up as ``Update.extras``. Return a dict of
        numbers (``train_local``'s ``train_loss`` and ``local_steps``, or your own), which the
        run averages over clients and the strategy sees as ``Update.metrics``.

        The default trains ``ctx.model.global_parameters()`` on the task's loss, plus
        ``penalty`` where it gives one, through ``train_local``. An override must keep a job
        deterministic: randomness only from ``ctx.generator``, ``ctx.phase(name)`` and torch's
        global RNG (seeded per job), so that the result depends on (run seed, client id,
        dispatch round) alone, on any worker. It keeps nothing on ``self`` between jobs (one
        instance trains many clients, in any order; per-client values go in ``ctx.state``),
        leaves the model's tensors their shapes and dtypes, and honours ``ctx.config``
        (``train_local`` does: ``epochs``, ``max_steps``, the optimiser). Overriding it makes
        batched execution train the clients one after another (unless ``train_batched`` is
        overridden too) and refuses ``local.dp_sgd`` (unless ``trains_privately`` says
        otherwise)."""
        from ..training.loop import train_local

        params = ctx.model.global_parameters()
        penalty = None
        if type(self).penalty is not ClientAlgorithm.penalty:  # snapshot only when needed
            penalty = self.penalty([p.detach().clone() for p in params])
        return train_local(
            ctx.model.module, params, ctx.task, ctx.data, ctx.config, ctx.generator, penalty
        )


class WeightedMean:
    """The one reduction every aggregator shares: an exact weighted sum of deltas
    (``raysim.algorithms.exact_sum``), the same bits in any order and grouping, so workers and
    nodes may add parts of it where the updates are (``Strategy.sums_updates``).

    Using one helper makes methods that coincide in theory (FedBuff with K = S vs FedAvg) coincide
    bit for bit too.
    """

    @staticmethod
    def combine(deltas: Sequence[np.ndarray | HeldDelta], weights: Sequence[float]) -> np.ndarray:
        """``Σ weights[j]·deltas[j]`` as float32; a delta may be held on its worker."""
        return combine(deltas, weights)


@dataclass(frozen=True)
class Method:
    """A registered method: its name, paper and spec section, its two halves and its model needs.

    ``groups`` are the parameter groups it trains (``models/layout.py``; the first is the shared,
    averaged one); ``evaluate_with`` names the group that answers for a known client (the
    personal one for personalised methods, FedOA spec §2.9; a new client always gets the global
    model); ``wrap_model`` may put modules around the resident model (e.g. an input map);
    ``needs`` is what the run must give it (checked before Ray starts).
    """

    name: str
    """The name a config gives it (``algorithm.name``)."""
    strategy: type[Strategy]
    """The server half, a ``Strategy`` subclass."""
    params: type[MethodParams] = MethodParams
    """Its parameters class, which validates the config's ``algorithm`` entries."""
    client: type[ClientAlgorithm] = ClientAlgorithm
    """The client half, a ``ClientAlgorithm`` subclass (the default trains on the task loss)."""
    reference: str = ""
    """The paper (and section) it implements, as ``raysim methods`` shows it."""
    groups: tuple[ParamGroup, ...] = DEFAULT_GROUPS
    """The parameter groups it trains; the first is the shared, averaged one."""
    evaluate_with: str = "global"
    """The group that answers for a known client when it is evaluated."""
    wrap_model: ModelWrapper | None = None
    """``(module, data_spec, params) -> module``: modules put around the resident model, or
    None."""
    needs: Needs = Needs()
    """What the run must give it, checked against the config before Ray starts."""
    each_because: str = MethodSpec.each_because
    """Where its strategy does not sum its updates, why it needs each (``MethodSpec``)."""
    partial_work: bool = False
    """With devices: it accepts a client's partial work (``MethodSpec.partial_work``)."""
    asynchronous: bool = False
    """With devices: it takes late updates in a later round (``MethodSpec.asynchronous``)."""

    @classmethod
    def of(cls, spec: MethodSpec, strategy: type[Strategy], **implementation: Any) -> Method:
        """A built-in method: name, params, needs and reference from its torch-free ``spec``,
        the rest (``client``, ``groups``, ...) given here."""
        method = cls(
            name=spec.name,
            strategy=strategy,
            params=spec.params,
            reference=spec.reference,
            needs=spec.needs,
            each_because=spec.each_because,
            partial_work=spec.partial_work,
            asynchronous=spec.asynchronous,
            **implementation,
        )
        if method.client.may_batch() != spec.batchable:
            raise ValueError(
                f"{spec.name}: its spec says batchable={spec.batchable}, its client "
                f"{method.client.__name__}.may_batch() says {not spec.batchable}"
            )
        if method.declares_secrets != spec.secrets:
            raise ValueError(
                f"{spec.name}: its spec says secrets={spec.secrets}, its strategy "
                f"{strategy.__name__} {'does not override' if spec.secrets else 'overrides'} "
                "secrets()"
            )
        if method.client.trains_privately() == spec.own_training:
            raise ValueError(
                f"{spec.name}: its spec says own_training={spec.own_training}, its client "
                f"{method.client.__name__}.trains_privately() says {not spec.own_training}"
            )
        if _sums(strategy) != spec.sums:
            raise ValueError(
                f"{spec.name}: its spec says sums={spec.sums}, its strategy {strategy.__name__} "
                f"says sums_updates={_sums(strategy)}"
            )
        return method

    @property
    def declares_secrets(self) -> bool:
        """Whether its strategy declares server-private values (overrides ``secrets``): the
        leak auditor is then on by default (``audit.leaks``)."""
        return self.strategy.secrets is not Strategy.secrets

    @property
    def spec(self) -> MethodSpec:
        """The torch-free half, for a method a plugin registers."""
        return MethodSpec(
            name=self.name,
            module=self.strategy.__module__,
            params=self.params,
            needs=self.needs,
            reference=self.reference,
            batchable=self.client.may_batch(),
            secrets=self.declares_secrets,
            sums=_sums(self.strategy),
            each_because=self.each_because,
            own_training=not self.client.trains_privately(),
            partial_work=self.partial_work,
            asynchronous=self.asynchronous,
        )

    def __post_init__(self) -> None:
        check_groups(self.groups)
        if self.evaluate_with not in {g.name for g in self.groups}:
            raise ValueError(f"{self.name}: evaluate_with={self.evaluate_with!r} is not a group")
        if self.client.trains_together is not ClientAlgorithm.trains_together:
            raise ValueError(
                f"{self.name}: {self.client.__name__} overrides trains_together; say it on the "
                f"params class ({self.params.__name__}), where the config reads it before any "
                "model loads"
            )

    @property
    def personal(self) -> bool:
        """Whether a known client is evaluated with its own state."""
        return self.evaluate_with != self.groups[0].name

    @property
    def batching(self) -> str:
        """For ``raysim methods``: how ``workers.execution: batched`` trains its clients."""
        client = self.client
        if client.train_batched is not ClientAlgorithm.train_batched:
            return "one pass (its own)"
        if client.train_together is not ClientAlgorithm.train_together:
            return "coupled (train_together)"
        return "one pass" if client.may_batch() else "one after another"

    @property
    def adapts_for_eval(self) -> bool:
        """Whether the client half overrides ``ClientAlgorithm.adapt``."""
        return self.client.adapt is not ClientAlgorithm.adapt

    def build_client(self, params: Mapping[str, Any]) -> ClientAlgorithm:
        """The client half, given the config's method parameters (validated by ``params``)."""
        return self.client(self.params(**params))

    def build_strategy(
        self, params: Mapping[str, Any], initial_weights: np.ndarray, num_clients: int
    ) -> Strategy:
        """The server half, given the config's method parameters, the initial global vector and
        the number of clients."""
        return self.strategy(self.params(**params), initial_weights, num_clients)


def _sums(strategy: type[Strategy]) -> bool:
    """``sums_updates`` of a strategy class (a composed one answers for its base: a property)."""
    value = inspect.getattr_static(strategy, "sums_updates", False)
    return value if isinstance(value, bool) else False
