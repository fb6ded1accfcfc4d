"""Composable hooks in the spirit of pfl-research's postprocessors: no subclassing needed.

- A ``Mixer`` runs on the server after any base strategy changed the global model:
  ``w_new = mix(round, w_prev, w_agg)`` (FedBaF spec §2.6: "any BaseAggregator followed by a
  post-aggregation hook"). ``ComposedStrategy`` chains mixers on a base strategy; the mixed model
  is what clients get next and what the base builds on (its own state, e.g. FedAdam's moments,
  sees client deltas only).
- A ``ClientBehaviour`` wraps chosen clients' local work on the workers: it may change the data
  before training and the update after it (label shuffling, corrupted or boosted updates).
  Attacks and defences are then config entries (``hooks.server`` / ``hooks.clients``), not forks.

Both register by name in ``registry.py`` (``MIXERS``, ``BEHAVIOURS``), like methods, and take
pydantic params. This module defines the interfaces only; it imports no implementation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .base import ClientContext, Downlink, Secret, Stateful, Strategy, Update
from .context import ServerContext
from .spec import BehaviourParams as BehaviourParams  # re-exported: defined torch-free in spec
from .spec import HookParams as HookParams
from .spec import MethodParams


class Mixer(Stateful):
    """Server-side post-aggregation hook. Override ``mix``; ``setup`` gets the server context."""

    def __init__(self, params: HookParams) -> None:
        self.params = params
        """The hook's parameters (its ``HookParams`` subclass, from the config's entry)."""

    def setup(self, ctx: ServerContext) -> None:
        """Take the server context (``ServerContext``), on a fresh run and on resume, after the
        base strategy's ``setup``."""
        self.ctx = ctx

    def mix(self, round_index: int, previous: np.ndarray, aggregated: np.ndarray) -> np.ndarray:
        """The new global model from the previous one and the base strategy's result."""
        return aggregated

    def initial(self, weights: np.ndarray) -> np.ndarray:
        """The model clients first receive, given the base's initial one (default: it)."""
        return weights

    def secrets(self) -> list[Secret]:
        """Server-private values that no payload to a client may carry (the leak auditor)."""
        return []

    def private_artifacts(self) -> list[Secret]:
        """Server-private values the user asked to log (a restricted run)."""
        return []

    def metrics(self) -> dict[str, float]:
        """Server-side diagnostics to log after each round, with the strategy's."""
        return {}

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        """Named tables the run saves at its end as ``strategy/NAME.csv``, with the
        strategy's."""
        return {}


ATTACKERS_TAG = 0xA77A
"""``default_rng([seed, ATTACKERS_TAG])`` orders the clients; the first ζ·K ones attack."""


def chosen_clients(fraction: float, seed: int, num_clients: int) -> list[int]:
    """The fixed set of ``round(fraction·K)`` clients drawn at setup from the run seed (FedBaF spec
    §4.4). One order per seed, so the set at ζ = 0.1 lies inside the set at ζ = 0.2."""
    order = np.random.default_rng([seed, ATTACKERS_TAG]).permutation(num_clients)
    return sorted(int(j) for j in order[: round(fraction * num_clients)])


class ClientBehaviour:
    """Changes what chosen clients do; runs on the workers around the method's client side."""

    params: BehaviourParams
    """The behaviour's parameters: its own, and which jobs it applies to."""

    def __init__(self, params: BehaviourParams) -> None:
        self.params = params
        self.run_seed = 0
        """The run seed, set by ``setup``."""
        self.members: frozenset[int] | None = (
            None if params.clients is None else frozenset(params.clients)
        )
        """The clients it applies to (None: every one): those listed, or those ``setup`` drew
        for a ``fraction``."""

    def setup(self, run_seed: int, num_clients: int) -> None:
        """Called once per process before any job: fixes the attacking set from the run seed."""
        self.run_seed = run_seed
        if self.params.fraction is not None:
            self.members = frozenset(chosen_clients(self.params.fraction, run_seed, num_clients))

    def applies(self, client: int, dispatch_round: int) -> bool:
        """Whether it changes ``client``'s job of ``dispatch_round``: a member, in one of the
        listed rounds (needs ``setup`` first where it has a ``fraction``)."""
        p = self.params
        if p.fraction is not None and self.members is None:
            raise RuntimeError("a behaviour with a fraction needs setup() before it applies")
        return (self.members is None or client in self.members) and (
            p.rounds is None or dispatch_round in p.rounds
        )

    def on_local(self, ctx: ClientContext, config: Any) -> Any:
        """The local-training settings of this job (default: unchanged; λ epoch scaling)."""
        return config

    def on_data(self, ctx: ClientContext, data: Any) -> Any:
        """The data the client trains on (default: unchanged)."""
        return data

    def on_update(self, ctx: ClientContext, delta: np.ndarray) -> np.ndarray:
        """The delta the client sends (default: unchanged)."""
        return delta

    def eval_sets(self, dataset: Any) -> dict[str, Any]:
        """Evaluation sets this behaviour adds to the run (e.g. triggered inputs for a backdoor's
        attack success rate); built once on the coordinator."""
        return {}

    attack: bool = False
    """True for an adversary's behaviour: the server's robust metrics count its clients'
    updates."""

    def forge(self, honest: np.ndarray, n: int, f: int) -> np.ndarray | None:
        """An omniscient attacker's update, forged on the server from the round's benign updates
        ``honest`` ((h, d), by client id) when ``n`` updates arrived, ``f`` of them this kind
        of attacker's: every client this behaviour applies to sends it instead of its own
        (``raysim.robust.server``). None (the default): the behaviour forges nothing."""
        return None

    @property
    def forges(self) -> bool:
        """Whether this behaviour forges its clients' updates on the server (overrides
        ``forge``)."""
        return type(self).forge is not ClientBehaviour.forge


class ComposedStrategy(Strategy):
    """A base strategy followed by mixers: whenever the base changes the global model, the
    mixers, in order, turn (previous, aggregated) into the model that is published."""

    def __init__(self, base: Strategy, mixers: Sequence[Mixer]) -> None:
        self.base = base
        """The method's own strategy, which aggregates."""
        self.mixers = list(mixers)
        """The mixers, in the order they apply."""

    @property
    def params(self) -> MethodParams:
        """The base's."""
        return self.base.params

    @property
    def uses_clients(self) -> bool:
        """The base's."""
        return self.base.uses_clients

    @property
    def stop_on_nonfinite(self) -> bool:
        """The base's."""
        return self.base.stop_on_nonfinite

    @property
    def sums_updates(self) -> bool:
        """The base's: a mixer reads the aggregated model, never an update."""
        return self.base.sums_updates

    @property
    def sums_each_round(self) -> bool:
        """The base's."""
        return self.base.sums_each_round

    @property
    def reads_client_states(self) -> bool:
        """The base's."""
        return self.base.reads_client_states

    @property
    def stop_reason(self) -> str | None:
        """The base's."""
        return self.base.stop_reason

    def updates_per_aggregation(self, clients_per_round: int) -> int:
        """The base's."""
        return self.base.updates_per_aggregation(clients_per_round)

    def notices(self) -> list[str]:
        """The base's."""
        return self.base.notices()

    def state_metrics(self, states: Mapping[int, Mapping[str, np.ndarray]]) -> dict[str, float]:
        """The base's."""
        return self.base.state_metrics(states)

    @property
    def weights(self) -> np.ndarray:
        """The global model: the base's (setting it sets the base's)."""
        return self.base.weights

    @weights.setter
    def weights(self, value: np.ndarray) -> None:
        self.base.weights = value

    def setup(self, ctx: ServerContext) -> None:
        """Set the base up, then each mixer, which may change the initial model in turn
        (``Mixer.initial``)."""
        self.base.setup(ctx)
        for m in self.mixers:
            m.setup(ctx)
            self.base.weights = np.asarray(m.initial(self.base.weights), dtype=np.float32)

    def secrets(self) -> list[Secret]:
        """The base's and every mixer's (a mixer composed on a method keeps its secrets)."""
        return [*self.base.secrets(), *(s for m in self.mixers for s in m.secrets())]

    def private_artifacts(self) -> list[Secret]:
        """The base's and every mixer's (a wrapper of a composed strategy keeps them)."""
        return [
            *self.base.private_artifacts(),
            *(s for m in self.mixers for s in m.private_artifacts()),
        ]

    def _mixed(self, round_index: int, previous: np.ndarray, changed: bool) -> bool:
        if changed:
            w = self.base.weights
            for m in self.mixers:
                w = np.asarray(m.mix(round_index, previous, w), dtype=np.float32)
            self.base.weights = w
        return changed

    def configure(self, round_index: int, clients: Sequence[int]) -> Downlink | None:
        """The base's."""
        return self.base.configure(round_index, clients)

    def on_arrival(self, update: Update) -> bool:
        """The base's, then every mixer where the base changed the global model."""
        previous = self.base.weights
        return self._mixed(update.arrival_round, previous, self.base.on_arrival(update))

    def on_round_end(self, round_index: int) -> bool:
        """The base's, then every mixer where the base changed the global model."""
        previous = self.base.weights
        return self._mixed(round_index, previous, self.base.on_round_end(round_index))

    def metrics(self) -> dict[str, float]:
        """The base's, then every mixer's (a later one wins a name they share)."""
        out = dict(self.base.metrics())
        for m in self.mixers:
            out.update(m.metrics())
        return out

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        """The base's, then every mixer's (a later one wins a name they share)."""
        out = dict(self.base.tables())
        for m in self.mixers:
            out.update(m.tables())
        return out

    def state_dict(self) -> dict[str, Any]:
        """The base's and every mixer's, apart."""
        return {"base": self.base.state_dict(), "mixers": [m.state_dict() for m in self.mixers]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.base.load_state_dict(state["base"])
        for m, s in zip(self.mixers, state["mixers"], strict=True):
            m.load_state_dict(s)

    def private_state(self) -> dict[str, np.ndarray]:
        """The base's and every mixer's, their names prefixed (``base/``, ``mixer{i}/``)."""
        out = {f"base/{k}": v for k, v in self.base.private_state().items()}
        for i, m in enumerate(self.mixers):
            out.update({f"mixer{i}/{k}": v for k, v in m.private_state().items()})
        return out

    def load_private_state(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore what ``private_state`` wrote."""

        def part(prefix: str) -> dict[str, np.ndarray]:
            return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}

        self.base.load_private_state(part("base/"))
        for i, m in enumerate(self.mixers):
            m.load_private_state(part(f"mixer{i}/"))


def compose(base: Strategy, mixers: Sequence[Mixer]) -> Strategy:
    """``base`` itself when there is no mixer (so plain runs are untouched), else composed."""
    return ComposedStrategy(base, mixers) if mixers else base
