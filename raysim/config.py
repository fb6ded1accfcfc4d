"""Typed run configuration: one YAML file + dotted ``key=value`` overrides → ``RunConfig``.

Everything is validated before Ray starts; errors name the offending key and the closest valid one.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from raysim.algorithms.registry import (
    BEHAVIOURS,
    MIXERS,
    PluginError,
    load_plugin,
    method_spec,
    modules_skipped,
)
from raysim.algorithms.spec import HookParams, MethodParams
from raysim.data.federated import DataSection, DigitsData
from raysim.devices.settings import DevicesConfig
from raysim.models.registry import ModelConfig, model_names, model_traits
from raysim.privacy.settings import PrivacyConfig
from raysim.robust.settings import RobustConfig
from raysim.schema import StrictModel, did_you_mean
from raysim.sim.delays import DelayParams, NoDelayParams, parse_delay_params
from raysim.sweeps.space import TuneSection
from raysim.training.settings import LocalTrainingConfig


class ConfigError(ValueError):
    """A configuration problem, with one line per offending key."""


class ClientStateConfig(StrictModel):
    """``clients.state``: where clients' personal state lives between their visits."""

    store: Literal["auto", "memory", "disk"] = Field(
        "auto",
        description="memory: Ray's object store (the coordinator holds references); disk: one "
        "file per client and version under dir, so memory does not grow with the population; "
        "auto: the plan chooses memory while the clients' personal state (estimated from the "
        "config) is within a quarter of this machine's memory, above it disk, said in the "
        "plan's client states line; memory on a named cluster or a Ray of several nodes (disk "
        "needs a dir every node mounts) and where dir would not outlive the run; a resume "
        "keeps its checkpoint's choice",
    )
    dir: str = Field(
        "raysim-states",
        description="disk: the folder the run's store goes in (a folder per run inside); on "
        "several nodes, one they all mount",
    )


def with_state_store(cfg: RunConfig, store: str) -> RunConfig:
    """``cfg`` with ``clients.state.store`` set to ``store`` (``memory`` or ``disk``: what
    ``auto`` resolved to), the rest of it as it is."""
    state = cfg.clients.state.model_copy(update={"store": store})
    clients = cfg.clients.model_copy(update={"state": state})
    return cfg.model_copy(update={"clients": clients})


class ClientsConfig(StrictModel):
    num: int = Field(100, ge=1, description="J, the number of virtual clients")
    per_round: int = Field(10, ge=1, description="S, clients dispatched per round")
    fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="C: per_round = max(⌊C·num⌋, 1) (FedBaF spec §7.2 inv. 9); not with per_round",
    )
    sampling: Literal["uniform", "poisson"] = Field(
        "uniform",
        description="how a round's clients are drawn from the idle ones: uniform: per_round of "
        "them without replacement (a fixed size); poisson: each independently with probability "
        "per_round/num (a size that varies; privacy's pld accountant analyses it)",
    )
    state: ClientStateConfig = Field(
        default_factory=ClientStateConfig,
        description="where clients' personal state (personalised methods) lives between visits",
    )

    @model_validator(mode="before")
    @classmethod
    def _per_round_from_fraction(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("fraction") is not None:
            data = dict(data)
            derived = max(math.floor(float(data["fraction"]) * int(data.get("num", 100))), 1)
            if "per_round" in data and data["per_round"] != derived:
                raise ValueError(
                    f"clients.fraction {data['fraction']} gives per_round {derived}; "
                    f"per_round {data['per_round']} contradicts it (give one of them)"
                )
            data["per_round"] = derived
        return data


class UncheckedParams(HookParams):
    """The parameters of a method or hook that only a module a dry run does not import would
    register: kept as given, checked when the run starts (``registry.module_policy``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown_keys(cls, data: Any) -> Any:
        return data


def _unchecked(data: Any, lookup: Callable[[str], Any], module: str | None) -> Any:
    """``data`` left unchecked where its name is unknown only because a dry run did not import
    the ``module`` that registers it; None where it can be checked."""
    if module is None or not modules_skipped() or not isinstance(data, Mapping):
        return None
    if "params" in data or data.get("name") is None:
        return None
    try:
        lookup(str(data["name"]))
        return None
    except KeyError:
        rest = {k: v for k, v in data.items() if k != "name"}
        return {"name": data["name"], "params": UncheckedParams(**rest), "module": module}


def has_unchecked(config: BaseModel) -> bool:
    """Whether part of ``config`` was left unchecked by a dry run (``UncheckedParams``)."""
    algorithm = getattr(config, "algorithm", None)
    entries = [algorithm, *getattr(getattr(config, "hooks", None), "server", []),
               *getattr(getattr(config, "hooks", None), "clients", [])]  # fmt: skip
    return any(isinstance(getattr(e, "params", None), UncheckedParams) for e in entries)


def _split_named(
    data: Any, lookup: Callable[[str], Any], what: str, section: str, entry_of: str = ""
) -> Any:
    """``{name: X, k: v, ...}`` → ``{"name": X, "params": <X's params model>(k=v, ...)}``, with
    "did you mean" for unknown names and parameters."""
    if not isinstance(data, Mapping) or "params" in data:
        return data
    data = dict(data)
    name = data.pop("name", None)
    if name is None:
        raise ValueError(f"every {what} needs a name")
    try:
        entry = lookup(str(name))
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    fields = [f.alias or n for n, f in entry.params.model_fields.items()]
    fields += [n for n in entry.params.model_fields if n not in fields]
    for key in data:
        if key not in fields:
            hint = did_you_mean(str(key), fields)
            known = ", ".join(fields) if fields else "none"
            raise ValueError(
                f"{what} {name!r} has no parameter {key!r}{hint}; its parameters: {known}"
                + (
                    # no near name: likely another method's, left from before a switch
                    f". To switch and drop the other's parameters, replace the whole section: "
                    f"{section}='{{name: {name}}}'"
                    if section and not hint
                    else ""
                )
            )
    try:
        params = entry.params(**data)
    except ValidationError as e:
        missing = [".".join(map(str, err["loc"])) for err in e.errors() if err["type"] == "missing"]
        if not missing:
            raise
        example = getattr(getattr(entry, "needs", None), "example", "")
        keys = ", ".join(f"{section}.{m}" if section else m for m in missing)
        raise ValueError(
            f"{name} needs {', '.join(missing)}: set {keys}"
            + (f" on its {entry_of} entry" if entry_of else "")
            + (f" ({example} shows how)" if example else "")
        ) from None
    return {"name": name, "params": params}


def _load_module(data: Mapping[str, Any], section: str) -> str | None:
    """Import the user's module a section names (``module:``), before its name is looked up;
    returns its canonical spec, which the config keeps so every Ray process imports the same."""
    module = data.pop("module", None)
    if module is None:
        return None
    try:
        return load_plugin(str(module))
    except PluginError as e:
        raise ValueError(f"{section}.{e}") from None


class AlgorithmConfig(StrictModel):
    """``name`` picks a registered method; every other key is one of that method's params.

    ``module`` imports a user's method module first (a dotted module name, or a ``.py`` file),
    in this process and in every Ray process that reads the config (``docs/adding-a-method.md``).
    """

    name: str = Field("fedavg", description="the method (its parameters sit beside it)")
    module: str | None = Field(
        None,
        description="a module of yours imported first, in every process, so that a method it "
        "registers can be named: a dotted module name or a .py file, e.g. my_method.py",
    )
    params: SerializeAsAny[MethodParams] = Field(
        default_factory=MethodParams,
        description="the method's parameters, written flat beside name (not under a key)",
    )

    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "params" not in data:
            data = dict(data)
            module = _load_module(data, "algorithm")
            data.setdefault("name", "fedavg")
            unchecked = _unchecked(data, method_spec, module)
            if unchecked is not None:
                return unchecked
            out = _split_named(data, method_spec, "algorithm", "algorithm")
            return {**out, "module": module}
        return data

    @model_serializer
    def _flat(self) -> dict[str, Any]:
        head = {"name": self.name} | ({"module": self.module} if self.module else {})
        return {**head, **self.params.model_dump(by_alias=True)}


class _HookConfig(StrictModel):
    """One hook entry: ``name``, optionally the user's ``module`` that registers it, its params."""

    name: str = Field(description="the registered hook; its parameters sit beside it")
    module: str | None = Field(
        None,
        description="a module of yours imported first, in every process, so that a hook it "
        "registers can be named: a dotted module name or a .py file",
    )
    params: SerializeAsAny[HookParams] = Field(
        default_factory=HookParams,
        description="the hook's parameters, written flat beside name (not under a key)",
    )

    @model_serializer
    def _flat(self) -> dict[str, Any]:
        head = {"name": self.name} | ({"module": self.module} if self.module else {})
        return {**head, **self.params.model_dump(by_alias=True)}

    @staticmethod
    def _split_hook(data: Any, lookup: Callable[[str], Any], what: str, section: str) -> Any:
        if not isinstance(data, Mapping) or "params" in data:
            return data
        data = dict(data)
        module = _load_module(data, section)
        unchecked = _unchecked(data, lookup, module)
        if unchecked is not None:
            return unchecked
        return {**_split_named(data, lookup, what, "", entry_of=section), "module": module}


class ServerHookConfig(_HookConfig):
    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        return cls._split_hook(data, MIXERS.spec, "server hook", "hooks.server")


class ClientHookConfig(_HookConfig):
    @model_validator(mode="before")
    @classmethod
    def _split(cls, data: Any) -> Any:
        return cls._split_hook(data, BEHAVIOURS.spec, "client behaviour", "hooks.clients")


class HooksConfig(StrictModel):
    """Composable hooks (``raysim/algorithms/hooks.py``): ``server`` mixers run in order after the
    method's aggregation; ``clients`` behaviours wrap the chosen clients' local work. An entry's
    ``module`` imports the user's file or package that registers it."""

    server: list[ServerHookConfig] = Field(
        default_factory=list,
        description="server mixers, applied in this order to the model after each aggregation",
    )
    clients: list[ClientHookConfig] = Field(
        default_factory=list,
        description="client behaviours (faults, attacks, observers) around chosen clients' jobs",
    )


class WorkersConfig(StrictModel):
    count: int | Literal["auto", "per_client"] = Field(
        "auto",
        description="pool size; 'auto' sizes it from the cluster; 'per_client' pins one each",
    )
    num_cpus: float = Field(1.0, ge=0, description="CPUs Ray reserves for each worker actor")
    num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs Ray reserves for each worker actor; a fraction (0.25) shares one GPU "
        "among workers, above 1 a whole number",
    )
    threads: int = Field(1, ge=1, description="torch intra-op threads per worker")
    max_restarts: int = Field(3, ge=0, description="times a dead worker is replaced")
    execution: Literal["auto", "sequential", "batched"] = Field(
        "auto",
        description="sequential: a worker trains its clients one after another; batched: in "
        "groups of group_size, one vmapped pass per step (raysim.training.batched); auto: "
        "batched where the method, model and local settings allow it, quietly sequential "
        "elsewhere (always with per_client actors)",
    )
    group_size: int = Field(
        16,
        ge=1,
        description="batched: clients per pass; groups are cut from the round's jobs in schedule "
        "order, so results do not depend on the pool",
    )
    late_jobs: Literal["together", "at_dispatch"] = Field(
        "together",
        description="batched, with delays: together: a job that arrives in a later round waits, "
        "until one of them is due; then the waiting jobs train, earliest arrival first, in as "
        "many full groups as the due jobs need (the rest wait on), each client from the version "
        "it was dispatched on, so groups grow with the delays; at_dispatch: each round's jobs "
        "train at once, in groups of that round only. Both follow from the schedule alone",
    )
    transport: Literal["auto", "calls", "in_process"] = Field(
        "auto",
        description="how the coordinator reaches its workers: auto: a Ray Compiled Graph to each "
        "pooled worker on the coordinator's node where the model's global vector is at most 1 "
        "MiB (about 0.1 ms a batch instead of ~3 ms), from the first batch on (from a run's third "
        "second on where the coordinator runs in a driver process); plain actor calls elsewhere "
        "and before; calls: plain actor calls only; in_process: the run's one "
        "worker (workers.count=1, on CPUs) trains in the coordinator's own process, with no "
        "round trip at all, but its imports come after the coordinator's and a crash while "
        "training ends the coordinator (which a new one replaces from the last checkpoint)",
    )

    partial_sums: bool | Literal["auto"] = Field(
        "auto",
        description="on a Ray pool, where the method's server step only sums its clients' "
        "updates (raysim methods NAME says): each update stays on its worker's node, where it is "
        "summed with the node's others; the coordinator receives one partial sum per node. Sums "
        "are exact (fixed point), so results are the same bits on or off, for any number of "
        "workers and nodes. auto: where the method sums and the model's global vector exceeds 1 "
        "MiB (a smaller delta is cheaper carried whole); true: wherever the method sums (plain "
        "calls, no compiled-graph links), refused for a method that needs each update; false: "
        "every update travels whole to the coordinator",
    )

    cuda_deterministic: bool = Field(
        True,
        description="a worker on a CUDA device uses deterministic kernels "
        "(CUBLAS_WORKSPACE_CONFIG=:4096:8, torch.use_deterministic_algorithms, warning once where "
        "an op has none), so that a client's update has the same bits whichever worker trains "
        "it; false: the fastest kernels, placements may then differ in the last bits",
    )

    @field_validator("count")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("workers.count must be ≥ 1, 'auto' or 'per_client'")
        return v


class CoordinatorConfig(StrictModel):
    num_cpus: float = Field(
        0.0,
        ge=0,
        description="CPUs Ray reserves for the coordinator (server-side methods compute there)",
    )
    num_gpus: float = Field(
        0.0, ge=0, description="GPUs Ray reserves for the coordinator; a fraction shares one"
    )
    node: Literal["store", "any"] = Field(
        "store",
        description="store: with a tracking store only this node reaches (a sqlite or file path, "
        "or a server on localhost) the coordinator runs on the driver's node, beside it; any: "
        "wherever Ray places it (a store path on a filesystem every node mounts)",
    )


class EvalConfig(StrictModel):
    every: int = Field(1, ge=1, description="evaluate the global model every N rounds")
    final_window: int = Field(5, ge=1, description="report max accuracy over the last N evals")
    # language-model tasks: evaluation runs on the workers
    rouge: Literal["every", "final", "never"] = Field(
        "every", description="when to decode and score ROUGE-1 (loss is computed at every eval)"
    )
    max_new_tokens: int = Field(
        16, ge=1, description="language models: tokens greedily generated per prompt for ROUGE-1"
    )
    batch_size: int = Field(
        16, ge=1, description="language models: examples per forward pass of evaluation"
    )
    id: bool = Field(True, description="also evaluate each client on its own test split")
    clients: int | None = Field(
        None,
        ge=1,
        description="per-client evaluation (personal state, adaptation, shifted inputs) over "
        "this many clients, the same every round: a sample drawn once from the seed, or for "
        "personal state the first clients to have one; None: every client (every client with "
        "personal state)",
    )
    local_accuracy: bool = Field(
        False,
        description="each job scores its trained model on the test images of its own classes "
        "before aggregation (client_local_accuracy; FedBaF spec §4.5, non-IID)",
    )
    train: bool = Field(
        False,
        description="also score the global model on every client's training rows together "
        "(global_train_loss, global_train_accuracy: the training loss over all devices that "
        "FedAvg's and FedProx's papers plot); classification data of at most 10^6 rows",
    )


class TrackingConfig(StrictModel):
    enabled: bool = Field(
        True, description="log to MLflow; false: console only (checkpoints need checkpoint.dir)"
    )
    uri: str | None = Field(
        None, description="MLflow URI; default: $MLFLOW_TRACKING_URI, else sqlite"
    )
    experiment: str = Field("raysim", description="the MLflow experiment the run goes in")
    run_name: str | None = Field(
        None,
        description="the MLflow run name; None: config name · method · dataset and partition · "
        "seed",
    )
    parent_run_id: str | None = Field(None, description="nest this run under an MLflow run")
    tags: dict[str, str] = Field(
        default_factory=dict, description="extra MLflow tags of the run, e.g. {team: vision}"
    )
    client_states: Literal["auto", "arrays", "manifest", "none"] = Field(
        "auto",
        description="clients' personal state at the run's end: arrays (client_states."
        "safetensors), manifest (clients.state.store: disk; the store's files, "
        "client_states.json), none; auto: arrays up to client_states_max_mb, above it a "
        "manifest (disk) or nothing (memory), said in one line",
    )
    client_states_max_mb: float = Field(
        1024.0, ge=0, description="client_states auto: the largest arrays artifact, in MiB"
    )


class CheckpointConfig(StrictModel):
    """Whole-run checkpoints for ``raysim run --resume`` (see ``raysim/state/checkpoint.py``)."""

    every: int = Field(0, ge=0, description="checkpoint after every N rounds; 0 = never")
    dir: str | None = Field(
        None,
        description="also write the latest checkpoint to this directory (needed when tracking "
        "is disabled; on a cluster it must be visible to the coordinator's node)",
    )


class CorruptUpdate(StrictModel):
    client: int = Field(ge=0, description="the client id whose update is corrupted")
    round: int = Field(ge=0, description="the dispatch round of the corrupted job")
    value: Literal["nan", "inf"] = Field(
        "nan", description="what replaces the update's first entry (the server rejects it)"
    )


class KillWorker(StrictModel):
    round: int = Field(ge=0, description="the worker is killed after this round's dispatch")
    worker: int = Field(0, ge=0, description="the index of the worker in the pool")


class KillCoordinator(StrictModel):
    round: int = Field(ge=0, description="the driver kills the coordinator before this round")


class AuditConfig(StrictModel):
    """Checks on what the coordinator sends to clients (``raysim/security/audit.py``)."""

    leaks: bool | Literal["auto"] = Field(
        "auto",
        description="fail the run if a payload to clients carries a server-private value "
        "(Strategy.secrets, e.g. FedBaF's foundation weights: docs/leak-auditor.md); auto: on "
        "where "
        "the method or a hooks.server mixer declares such values, off elsewhere; false over "
        "declared values warns and tags the run raysim.audit.leaks=off",
    )
    windows: bool = Field(
        True,
        description="also look for in-order copies inside larger arrays and at other "
        "coordinates (an index of about 26 bytes per private value, built at the first check; "
        "docs/leak-auditor.md)",
    )
    transposes: bool = Field(
        True,
        description="the search inside larger arrays (windows) also looks for each 2-D block's "
        "transpose, in any precision and after any a·s + b (their keys double the index for "
        "those blocks)",
    )
    on_leak: Literal["stop", "report"] = Field(
        "stop",
        description="stop: a leak ends the run before the payload goes out; report: each "
        "leaking payload is named in a warning (console, warnings.txt, the leaks_reported "
        "metric) and sent anyway, to audit a whole run of a method under study",
    )


class FaultsConfig(StrictModel):
    """Fault injection for robustness experiments (and the recovery tests)."""

    kill_worker: KillWorker | None = Field(
        None, description="kill one worker process once (a new one replaces it); None: never"
    )
    kill_coordinator: KillCoordinator | None = Field(
        None,
        description="kill the coordinator once; a new one resumes from the newest checkpoint "
        "(else replays from round 0); None: never",
    )
    corrupt_updates: list[CorruptUpdate] = Field(
        default_factory=list,
        description="updates replaced by NaN or Inf (corrupt client behaviours), e.g. "
        "[{client: 3, round: 2}]",
    )


class RunConfig(StrictModel):
    """A whole run. See ``examples/quickstart.yaml`` for an annotated instance."""

    name: str = Field("run", description="the config's name, first in the MLflow run name")
    seed: int = Field(
        0,
        description="the run's seed: the data split and partition, the model's initialisation, "
        "client sampling, delays and every client's random stream follow from it",
    )
    rounds: int = Field(
        30, ge=1, description="rounds of the run: dispatch, arrivals and the server's step"
    )
    clients: ClientsConfig = Field(
        default_factory=ClientsConfig, description="the client population and its sampling"
    )
    data: DataSection = Field(
        default_factory=DigitsData, description="the data source, picked by data.name"
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="the model, by name")
    local: LocalTrainingConfig = Field(
        default_factory=LocalTrainingConfig,
        description="how every client trains locally (the same for every method)",
    )
    algorithm: AlgorithmConfig = Field(
        default_factory=AlgorithmConfig, description="the method, by name, and its parameters"
    )
    hooks: HooksConfig = Field(
        default_factory=HooksConfig, description="server mixers and client behaviours"
    )
    delays: SerializeAsAny[DelayParams] = Field(
        default_factory=NoDelayParams,
        description="how many rounds a client's update takes to arrive, picked by delays.kind",
    )
    devices: DevicesConfig = Field(
        default_factory=DevicesConfig,
        description="clients as devices: speed, bandwidth and availability (docs/devices.md)",
    )
    eval: EvalConfig = Field(
        default_factory=EvalConfig, description="when and how the models are evaluated"
    )
    workers: WorkersConfig = Field(
        default_factory=WorkersConfig, description="the worker actors that train the clients"
    )
    coordinator: CoordinatorConfig = Field(
        default_factory=CoordinatorConfig, description="the coordinator actor's resources"
    )
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="MLflow logging of the run"
    )
    faults: FaultsConfig = Field(
        default_factory=FaultsConfig, description="faults injected on purpose (robustness tests)"
    )
    audit: AuditConfig = Field(
        default_factory=AuditConfig,
        description="the leak auditor's checks on what clients receive (docs/leak-auditor.md)",
    )
    privacy: PrivacyConfig = Field(
        default_factory=PrivacyConfig,
        description="user-level differential privacy (docs/privacy.md)",
    )
    robust: RobustConfig = Field(
        default_factory=RobustConfig,
        description="a Byzantine-robust rule in place of the server's mean (docs/robustness.md)",
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig,
        description="whole-run checkpoints for raysim run --resume",
    )
    runtime: Literal["auto", "ray", "local"] = Field(
        "auto",
        description="where the run's processes are: ray: a coordinator actor and worker actors; "
        "local: the whole run in the caller's process, without Ray (refused where the config "
        "needs Ray); auto: local where Ray would add nothing that runs in parallel (a round's "
        "clients in one group or one worker, on CPUs, a private run, no process faults; kept on "
        "Ray where Ray is up in the process or a GPU is visible), else ray. The results are the "
        "same either way (raysim/launch/without_ray.py)",
    )
    tune: TuneSection | None = Field(
        None, description="raysim tune: the search space and how trials run; ignored by a run"
    )

    @field_validator("delays", mode="before")
    @classmethod
    def _delay_kind(cls, v: Any) -> Any:
        return parse_delay_params(dict(v)) if isinstance(v, Mapping) else v

    @model_validator(mode="after")
    def _cross_checks(self) -> RunConfig:
        if self.tracking.client_states == "manifest" and self.clients.state.store != "disk":
            raise ValueError(
                "tracking.client_states=manifest lists the files of a store on disk: set "
                "clients.state.store=disk, or tracking.client_states to arrays or none"
            )
        if self.clients.per_round > self.clients.num:
            raise ValueError(
                f"clients.per_round ({self.clients.per_round}) exceeds clients.num "
                f"({self.clients.num}): lower clients.per_round or raise clients.num"
            )
        # here, not in ModelConfig: a plugin (algorithm.module) may register the model
        names = model_names()
        if modules_skipped() and self.model.name not in names:
            return self  # a module a dry run did not import may register it: checked at start
        if has_unchecked(self):
            return self  # the method's needs are known once its module is imported
        if self.model.name not in names:
            close = difflib.get_close_matches(self.model.name, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown model {self.model.name!r}{hint}; known: {', '.join(names)}")
        unmet = method_spec(self.algorithm.name).needs.unmet(
            self.algorithm.name,
            self.model.name,
            set(model_traits(self.model.name)),
            self.data.server_data().id_size,
            len(self.data.server_data().ood),
            self.local,
        )
        if unmet:
            raise ValueError(unmet)
        self._check_together()
        self._check_partial_sums()
        self._check_privacy()
        self._check_devices()
        self._check_robust()
        for f in self.faults.corrupt_updates:
            if f.client >= self.clients.num:
                raise ValueError(
                    f"faults.corrupt_updates names client {f.client}, beyond clients.num"
                )
            if f.round >= self.rounds:
                raise ValueError(
                    f"faults.corrupt_updates names round {f.round}; the run has rounds "
                    f"0..{self.rounds - 1}"
                )
        for name in ("kill_worker", "kill_coordinator"):
            kill = getattr(self.faults, name)
            if kill is not None and kill.round >= self.rounds:
                raise ValueError(
                    f"faults.{name}.round={kill.round}; the run has rounds 0..{self.rounds - 1}"
                )
        if self.checkpoint.every and not self.tracking.enabled and not self.checkpoint.dir:
            raise ValueError(
                f"checkpoint.every={self.checkpoint.every} needs somewhere to write: MLflow "
                "(tracking.enabled=true) or a directory (checkpoint.dir=PATH)"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def run_name(self) -> str:
        """The MLflow run name: ``tracking.run_name``, else what tells runs of one config apart:
        config name, method, dataset, its label partition (α for Dirichlet), and seed."""
        if self.tracking.run_name:
            return self.tracking.run_name
        split = self.data.partition_label()  # empty for text tasks: split by task
        return f"{self.name} · {self.algorithm.name} · {self.data.name}{split} · seed {self.seed}"

    def group_size(self) -> int:
        """How many of a submission's jobs train together: 1 (each alone), ``workers.group_size``
        (batched execution) or all of them (a method whose clients train together)."""
        if self.algorithm.params.trains_together:
            return sys.maxsize
        w = self.workers
        if w.execution == "sequential" or (w.execution == "auto" and not self.may_batch()):
            return 1
        return w.group_size

    def may_batch(self) -> bool:
        """``workers.execution: auto``: whether the clients may train batched, as far as the
        config tells (the worker checks the built model, ``ClientRunner.sequential_reason``)."""
        local = self.local
        return (
            self.workers.count != "per_client"
            and method_spec(self.algorithm.name).batchable  # decided by the client class
            and local.backend == "torch"
            and local.mixed_precision == "no"
            and local.grad_accumulation == 1
        )

    def _check_together(self) -> None:
        """A method whose round trains together (FedOT's exact centring) runs it on one worker,
        each client on its own copy of the resident model."""
        if self.workers.execution == "batched" and self.workers.count == "per_client":
            raise ValueError(
                "workers.execution batched trains a worker's clients in groups; per_client "
                "actors hold one client each: set workers.count to a number"
            )
        if not self.algorithm.params.trains_together:
            return
        what = f"{self.algorithm.name} trains a round's clients together on one worker"
        if self.workers.count == "per_client":
            raise ValueError(f"{what}: set workers.count to a number (not per_client)")
        if self.data.input_shift().kind == "embedding":
            raise ValueError(
                f"{what}; data.shift.kind embedding shifts one resident model per worker: "
                "set algorithm.dual_centering sync"
            )

    def partial_sums(self) -> bool:
        """Whether a Ray pool keeps the clients' deltas where they are and sums them there
        (``workers.partial_sums``): true or auto, for a method whose strategy sums its updates,
        unless a robust rule or a forging attacker reads each update."""
        return (
            self.workers.partial_sums is not False
            and method_spec(self.algorithm.name).sums
            and not self.reads_each_update()
        )

    def forging_behaviours(self) -> list[str]:
        """The client behaviours whose updates the server forges (``ClientBehaviour.forge``)."""
        return [name for name, _ in self.client_hooks() if BEHAVIOURS.spec(name).forges]

    def reads_each_update(self) -> str:
        """Why the server reads each update whole for ``raysim.robust`` ("" where it does not)."""
        if self.robust.reads_each_update:
            return f"robust.rule {self.robust.rule} reads every update of a round"
        if forging := self.forging_behaviours():
            return f"{forging[0]} forges its update from the round's benign ones"
        return ""

    def _check_partial_sums(self) -> None:
        if self.workers.partial_sums is not True:
            return
        spec = method_spec(self.algorithm.name)
        if not spec.sums:
            raise ValueError(
                f"workers.partial_sums true: {self.algorithm.name} needs each update whole "
                f"({spec.each_because}); set workers.partial_sums to auto or false"
            )
        if why := self.reads_each_update():
            raise ValueError(
                f"workers.partial_sums true: {why}, so updates travel whole; set "
                "workers.partial_sums to auto or false"
            )

    def _check_robust(self) -> None:
        """``robust`` and forging attackers: a synchronous method that averages its clients'
        deltas, a rule its paper covers for this n and f, not under privacy (yet)."""
        why = self.reads_each_update()
        if not why:
            return
        spec = method_spec(self.algorithm.name)
        if not spec.sums or spec.asynchronous:
            raise ValueError(
                f"{why}, which replaces the server's average of a round's client deltas; "
                f"{self.algorithm.name} does not average them in synchronous rounds (raysim "
                "methods says which do: fedavg, fedprox, fedadam, ...)"
            )
        if self.privacy.enabled:
            raise ValueError(
                f"{why}; privacy (its clipping, noise and secure aggregation) and robust "
                "aggregation are not combined yet: set privacy.mode none or robust.rule none"
            )
        if self.robust.reads_each_update:
            from raysim.robust.rules import RULES

            if self.clients.sampling == "poisson":
                raise ValueError(
                    f"robust.rule {self.robust.rule} checks its assumption on a round's n "
                    "updates, which Poisson sampling leaves to chance: set clients.sampling "
                    "uniform"
                )
            RULES[self.robust.rule].check(self.clients.per_round, self.robust.f)

    def _check_devices(self) -> None:
        d = self.devices
        if not d.enabled:
            return
        if self.delays.kind != "none":
            raise ValueError(
                "devices set how long each client takes (its speed, bandwidth and hours): set "
                "delays.kind none, or devices.enabled false"
            )
        if self.clients.sampling != "uniform":
            raise ValueError(
                "devices sample among the clients available at a round's start; Poisson "
                "sampling over them is not built: set clients.sampling uniform"
            )
        spec = method_spec(self.algorithm.name)
        late = d.late if d.late != "auto" else ("deliver" if spec.asynchronous else "drop")
        if late == "deliver" and (d.close_after or d.overcommit > 1):
            raise ValueError(
                f"{self.algorithm.name} delivers late updates in later rounds (devices.late "
                "auto), whose lengths must be known: rounds that close early (close_after, "
                "overcommit) cannot; set devices.late drop"
            )
        if late == "deliver" and d.stragglers:
            raise ValueError(
                "devices.stragglers cut a round's jobs at its deadline (FedProx's synchronous "
                f"rounds), but {self.algorithm.name} lets late jobs finish (devices.late auto): "
                "set devices.late drop"
            )
        if late == "deliver" and self.privacy.secure_aggregation.enabled:
            raise ValueError(
                "privacy.secure_aggregation runs one protocol over a round's clients, but "
                "devices.late deliver lets updates arrive in later rounds: set devices.late drop"
            )

    def _check_privacy(self) -> None:
        p = self.privacy
        if self.local.dp_sgd is not None and method_spec(self.algorithm.name).own_training:
            raise ValueError(
                f"local.dp_sgd: {self.algorithm.name}'s client trains its own way (outside the "
                "default local loop), which DP-SGD does not cover; pick a method that trains "
                "through it (fedavg, fedprox, fedit, fedadam, fedbuff, ...) or set local.dp_sgd "
                "null"
            )
        if p.accountant == "pld" and p.enabled and self.clients.sampling != "poisson":
            raise ValueError(
                "privacy.accountant pld analyses Poisson sampling only: set clients.sampling "
                "poisson, or privacy.accountant rdp (which also analyses fixed-size sampling)"
            )
        if p.audit.canaries > self.clients.num:
            raise ValueError(
                f"privacy.audit.canaries ({p.audit.canaries}) exceeds clients.num "
                f"({self.clients.num}): canaries are clients of the population"
            )
        if not p.enabled:
            if p.audit.canaries:
                raise ValueError(
                    "privacy.audit audits a private run: set privacy.mode central or local"
                )
            return
        if p.secure_aggregation.enabled and self.delays.kind != "none":
            raise ValueError(
                "privacy.secure_aggregation runs one protocol per round over the clients "
                "dispatched in it: set delays.kind none"
            )
        spec = method_spec(self.algorithm.name)
        if not spec.sums:
            raise ValueError(
                f"privacy.mode {p.mode}: {self.algorithm.name} needs each update whole "
                f"({spec.each_because}), so no noise on a sum covers it; pick a method whose "
                "updates are summed (raysim methods) or set privacy.mode none"
            )

    def client_hooks(self) -> list[tuple[str, HookParams]]:
        """``hooks.clients`` in order, then ``faults.corrupt_updates`` as ``corrupt`` behaviours."""
        out = [(h.name, h.params) for h in self.hooks.clients]
        corrupt = BEHAVIOURS.spec("corrupt").params
        for f in self.faults.corrupt_updates:
            out.append(("corrupt", corrupt(clients=[f.client], rounds=[f.round], value=f.value)))
        return out


def parse_value(text: str) -> Any:
    """Parse an override value as YAML (``50`` → int, ``true`` → bool, ``[1,2]`` → list)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def check_override(item: str) -> None:
    """Refuse, in one line that shows how to write it, an override that is not ``key=value`` or
    whose YAML value holds a mapping key with a colon and no value: ``'algorithm={name:fedit}'``
    (no space after the colon) reads as the key ``name:fedit``, where ``{name: fedit}`` was
    meant."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} is not of the form key=value")
    if ":" not in text:
        return
    glued = _glued_keys(parse_value(text))
    if glued:
        fixed = text
        for k in glued:
            name, _, value = k.partition(":")
            fixed = fixed.replace(k, f"{name}: {value}", 1)
        raise ConfigError(
            f"override {item!r}: YAML reads {glued[0]!r} as one key with no value (a colon "
            f"needs a space after it); write '{key}={fixed}'"
        )


def _glued_keys(value: Any) -> list[str]:
    """The keys ``a:b`` with no value in a parsed override, nested ones included."""
    out: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            name, colon, rest = k.partition(":") if isinstance(k, str) else ("", "", "")
            if colon and name.strip() and rest.strip() and v is None:
                out.append(k)
            out += _glued_keys(v)
    elif isinstance(value, list):
        for v in value:
            out += _glued_keys(v)
    return out


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (a copy); intermediate dicts are created.
    A malformed override is refused (``check_override``)."""
    out = yaml.safe_load(yaml.safe_dump(raw)) or {}
    for item in overrides:
        check_override(item)
        key, _, value = item.partition("=")
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = parse_value(value)
    return out


def _nearby_config(path: Path) -> str:
    """`` (did you mean …?)`` naming the closest YAML file beside ``path``, if any is close."""
    import difflib

    folder = path.parent if path.parent.is_dir() else None
    if folder is None:
        return ""
    files = {p.stem: p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()}
    # by the names alone: the shared ".yaml" made any short name look close to any other
    close = difflib.get_close_matches(path.stem, list(files), n=1, cutoff=0.6)
    return f" (did you mean {files[close[0]]}?)" if close else ""


def _yaml_message(path: Path, error: yaml.YAMLError) -> str:
    """``file:line:col: problem`` (1-based), from PyYAML's marks."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    return f"{where}: invalid YAML: {problem}"


#: sections that are a union tagged by their ``name``: pydantic puts the tag after the section's
#: key in an error's location (``data.hf.hf.path``), where the user wrote none
TAGGED_SECTIONS = ("data",)


def _location(loc: tuple[int | str, ...]) -> str:
    """An error's location as the user wrote the key (without pydantic's union tags)."""
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    if len(parts) > 1 and parts[0] in TAGGED_SECTIONS:
        del parts[1]
    return ".".join(parts)


def _format(error: ValidationError) -> str:
    lines = []
    for e in error.errors():
        loc = _location(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        if e["type"] not in ("value_error", "assertion_error", "missing") and not isinstance(
            got, dict
        ):
            msg += f" (got {got!r})"
        if loc and msg.startswith(f"{loc}."):  # the message names the key itself
            loc = ""
        lines.append(f"{loc}: {msg}" if loc else msg)
    if len(lines) == 1:
        return f"invalid config: {lines[0]}"
    return "invalid config:\n  " + "\n  ".join(lines)


def load_config(
    source: str | Path | Mapping[str, Any] | RunConfig, overrides: Iterable[str] = ()
) -> RunConfig:
    """Read a YAML path, a dict or a ``RunConfig``, apply overrides and validate; raises
    ``ConfigError``. A ``RunConfig`` without overrides comes back as it is."""
    overrides = list(overrides)
    if isinstance(source, RunConfig):
        if not overrides:
            return source
        source = source.to_dict()
    if isinstance(source, Mapping):
        raw = dict(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}{_nearby_config(path)}")
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(_yaml_message(path, e)) from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the config ({e})") from None
        if raw is None:
            raise ConfigError(
                f"{path} is empty: write at least one setting (each one left out takes its "
                "default; examples/quickstart.yaml shows the usual ones)"
            )
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys")
    raw = apply_overrides(raw, overrides)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format(e)) from None


def config_from_wire(config: RunConfig | Mapping[str, Any]) -> RunConfig:
    """A config as the driver sends it to an actor (``to_dict()``), validated once per process:
    the same dict again (another actor, worker or trial in this process) costs a dict lookup, and
    plugin modules load once. The result is shared; treat it as read-only."""
    if isinstance(config, RunConfig):
        return config
    return _validated(json.dumps(config, sort_keys=True))


@functools.lru_cache(maxsize=16)
def _validated(wire: str) -> RunConfig:
    return RunConfig.model_validate(json.loads(wire))


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (for MLflow params)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out
