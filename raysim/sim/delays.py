"""Client-delay models on the virtual clock (unit: rounds), behind a registry.

A model draws one continuous delay per dispatch (Feddle spec §2.2 A3); ``mode: per_client_fixed``
draws once per client instead. Add a model (e.g. a trace file) with ``@register_delay`` and a
params class: the coordinator never changes.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from pydantic import Field

from raysim.schema import StrictModel


class DelayParams(StrictModel):
    """Fields shared by every delay model."""

    kind: str = Field("none", description="the delay model")
    rounding: Literal["floor", "round", "ceil"] = Field(
        "floor",
        description="the round an update arrives in: dispatch round + delay, rounded this way "
        "(never before its dispatch; Feddle spec §2.2 A2)",
    )
    mode: Literal["per_dispatch", "per_client_fixed"] = Field(
        "per_dispatch",
        description="per_dispatch: a fresh delay for every job; per_client_fixed: one per "
        "client, drawn once",
    )


class DelayModel:
    """Draws continuous delays (in rounds) for a batch of dispatched clients."""

    def __init__(self, params: DelayParams, num_clients: int, seed: int = 0) -> None:
        self.params = params
        self.num_clients = num_clients
        self.seed = seed
        self._fixed: np.ndarray | None = None

    def draw(self, rng: np.random.Generator, clients: np.ndarray) -> np.ndarray:
        """One draw per client in ``clients`` (in that order); subclasses implement this."""
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, clients: np.ndarray) -> np.ndarray:
        """Delays for the dispatched ``clients`` (honours ``mode``)."""
        if self.params.mode == "per_client_fixed":
            if self._fixed is None:
                self._fixed = self.draw(rng, np.arange(self.num_clients))
            return self._fixed[clients]
        return self.draw(rng, clients)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to continue the same draws (a subclass adds its own state)."""
        return {"fixed": None if self._fixed is None else self._fixed.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fixed = state.get("fixed")
        self._fixed = None if fixed is None else np.array(fixed, copy=True)

    def delivery_round(self, dispatch_round: int, delay: np.ndarray) -> np.ndarray:
        """Integer round in which each update is delivered (Feddle spec §2.2 A2)."""
        t = dispatch_round + delay
        op = {"floor": np.floor, "round": np.round, "ceil": np.ceil}[self.params.rounding]
        return np.maximum(op(t), dispatch_round).astype(np.int64)


class NoDelayParams(DelayParams):
    kind: Literal["none"] = Field(
        "none", description="synchronous rounds: every update arrives in its dispatch round"
    )


class NoDelay(DelayModel):
    """Synchronous FL: every update arrives in its dispatch round."""

    def draw(self, rng, clients):
        return np.zeros(len(clients))


class HalfNormalParams(DelayParams):
    kind: Literal["half_normal"] = Field(
        "half_normal", description="delays |z| in rounds, z ~ N(0, σ²)"
    )
    sigma: float = Field(5.0, ge=0, description="σ of z ~ N(0, σ²); d = |z| (Feddle spec §2.1)")


class HalfNormal(DelayModel):
    def draw(self, rng, clients):
        return np.abs(rng.normal(0.0, self.params.sigma, size=len(clients)))


class LogNormalParams(DelayParams):
    kind: Literal["log_normal"] = Field(
        "log_normal", description="delays in rounds, log-normally distributed"
    )
    mu: float = Field(0.0, description="mean of log d")
    sigma: float = Field(1.0, ge=0, description="std of log d")


class LogNormal(DelayModel):
    def draw(self, rng, clients):
        return rng.lognormal(self.params.mu, self.params.sigma, size=len(clients))


class ClientSpeedParams(DelayParams):
    kind: Literal["client_speed"] = Field(
        "client_speed",
        description="a fixed speed per client: slow or fast devices, the same all run",
    )
    base: float = Field(1.0, ge=0, description="delay of a speed-1 client, in rounds")
    slow_fraction: float = Field(0.2, ge=0, le=1, description="share of slow devices")
    slow_factor: float = Field(5.0, gt=0, description="slow devices take this many times base")
    fast_factor: float = Field(1.0, gt=0, description="other devices take this many times base")
    jitter: float = Field(0.0, ge=0, description="σ of multiplicative log-normal noise per job")


class ClientSpeed(DelayModel):
    """Slow and fast devices: a fixed per-client speed factor times ``base``, optional jitter.

    Which clients are slow is fixed for the run (drawn from the run seed, independent of the
    schedule stream), so the same clients are always the stragglers.
    """

    def __init__(self, params: ClientSpeedParams, num_clients: int, seed: int = 0) -> None:
        super().__init__(params, num_clients, seed)
        p = params
        rng = np.random.default_rng([seed, 7_919])
        slow = rng.random(num_clients) < p.slow_fraction
        self.factors = np.where(slow, p.slow_factor, p.fast_factor)

    def draw(self, rng, clients):
        d = self.params.base * self.factors[clients]
        if self.params.jitter:
            d = d * rng.lognormal(0.0, self.params.jitter, size=len(clients))
        return d


_REGISTRY: dict[str, tuple[type[DelayParams], type[DelayModel]]] = {
    "none": (NoDelayParams, NoDelay),
    "half_normal": (HalfNormalParams, HalfNormal),
    "log_normal": (LogNormalParams, LogNormal),
    "client_speed": (ClientSpeedParams, ClientSpeed),
}


def register_delay(name: str, params: type[DelayParams]) -> Callable[[type], type]:
    def wrap(cls: type[DelayModel]) -> type[DelayModel]:
        _REGISTRY[name] = (params, cls)
        return cls

    return wrap


def delay_kinds() -> list[str]:
    return sorted(_REGISTRY)


def parse_delay_params(raw: dict[str, Any]) -> DelayParams:
    """Validate a ``delays:`` section against the params class of its ``kind``."""
    kind = raw.get("kind", "none")
    if kind not in _REGISTRY:
        close = difflib.get_close_matches(str(kind), list(_REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown delay kind {kind!r}{hint}; known: {', '.join(delay_kinds())}")
    return _REGISTRY[kind][0](**raw)


def build_delay_model(params: DelayParams, num_clients: int, seed: int = 0) -> DelayModel:
    return _REGISTRY[params.kind][1](params, num_clients, seed)
