"""The ``tune:`` config section: a search space over dotted config keys, the metric, and how
trials are searched and stopped. Pure pydantic; Ray Tune objects are made only in ``to_tune``."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from raysim.schema import StrictModel

#: the domain kinds a ``space`` entry may name, as Ray Tune spells them
KINDS = ("grid", "choice", "uniform", "loguniform", "randint", "quniform")


class Domain(StrictModel):
    """One swept key: exactly one of ``grid: [v, ...]`` (every value, crossed with the other
    grids), ``choice: [v, ...]`` (sampled), ``uniform: [lo, hi]``, ``loguniform: [lo, hi]``,
    ``randint: [lo, hi)`` or ``quniform: [lo, hi, q]``."""

    grid: list[Any] | None = Field(
        None, description="every value, crossed with the other grids, e.g. [0.01, 0.1]"
    )
    choice: list[Any] | None = Field(None, description="values to sample from, e.g. [16, 32]")
    uniform: list[float] | None = Field(None, description="[low, high], sampled uniformly")
    loguniform: list[float] | None = Field(
        None, description="[low, high], uniform in log scale (low > 0), e.g. [1e-4, 1e-1]"
    )
    randint: list[int] | None = Field(None, description="[low, high): an integer, uniformly")
    quniform: list[float] | None = Field(
        None, description="[low, high, q]: uniform, rounded to a multiple of q"
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Domain:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a search domain names exactly one of {', '.join(KINDS)}")
        kind, args = given[0], getattr(self, given[0])
        if kind in ("grid", "choice") and not args:
            raise ValueError(f"{kind} needs at least one value")
        if kind in ("uniform", "loguniform", "randint"):
            if len(args) != 2 or not args[0] < args[1]:
                raise ValueError(f"{kind} needs [low, high] with low < high, got {args}")
        if kind == "quniform" and (len(args) != 3 or not args[0] < args[1] or args[2] <= 0):
            raise ValueError(f"quniform needs [low, high, q] with low < high and q > 0: {args}")
        if kind == "loguniform" and args[0] <= 0:
            raise ValueError(f"loguniform needs a positive low bound, got {args[0]}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) is not None)

    @property
    def args(self) -> list[Any]:
        return getattr(self, self.kind)

    def representatives(self) -> list[Any]:
        """Values that stand for the domain when the keys are checked before anything runs."""
        a = self.args
        if self.kind in ("grid", "choice"):
            return list(a)
        if self.kind == "randint":
            return [a[0], a[1] - 1]
        if self.kind == "quniform":
            return [a[0], math.floor(a[1] / a[2]) * a[2]]
        return [a[0], a[1]]

    def to_tune(self) -> Any:
        from ray import tune

        a = self.args
        return {
            "grid": lambda: tune.grid_search(list(a)),
            "choice": lambda: tune.choice(list(a)),
            "uniform": lambda: tune.uniform(*a),
            "loguniform": lambda: tune.loguniform(*a),
            "randint": lambda: tune.randint(*a),
            "quniform": lambda: tune.quniform(*a),
        }[self.kind]()


class Asha(StrictModel):
    """ASHA over rounds (the time attribute is the round the coordinator reports)."""

    grace_period: int = Field(1, ge=1, description="rounds every trial runs before a cut")
    reduction_factor: int = Field(2, ge=2, description="one trial in this many goes on at each cut")
    max_t: int | None = Field(
        None, ge=1, description="the most rounds a trial runs; None: the run's rounds"
    )


class TuneSection(StrictModel):
    """``raysim tune``: one trial is one raysim run of the config with the sampled values."""

    space: dict[str, Domain] = Field(
        description="dotted config key -> search domain, e.g. {local.lr: {loguniform: [1e-3, 0.1]}}"
    )
    metric: str = Field("accuracy", description="a per-round metric the run reports")
    mode: Literal["max", "min"] = Field(
        "max", description="whether metric is maximised or minimised"
    )
    num_samples: int = Field(1, ge=1, description="samples (each grid point this many times)")
    max_concurrent_trials: int | None = Field(
        None, ge=1, description="trials at a time at most; None: as many as the resources fit"
    )
    scheduler: Literal["fifo", "asha"] = Field(
        "fifo", description="fifo: every trial runs to the end; asha: poor trials stop early"
    )
    asha: Asha = Field(default_factory=Asha, description="scheduler asha: its settings")
    search: Literal["random", "grid"] = Field(
        "random", description="random samples the non-grid domains; grid needs only grid ones"
    )
    worker: Literal["auto", "here", "actor"] = Field(
        "auto",
        description="here: a trial whose run has one worker on CPUs (and no faults.kill_worker) "
        "trains its clients in the trial's own process, beside its coordinator: a later trial "
        "in that process starts without a new process or fresh imports, and no round has a "
        "round trip; actor: the worker is a Ray actor of its own, as in raysim run, whose "
        "imports run beside the trial's on another core; auto: here where the sweep has more "
        "trials than run side by side (trial processes are reused) and no node-local store "
        "pins trials to a cluster's head, else actor. The weights are the same either way",
    )

    @model_validator(mode="after")
    def _check(self) -> TuneSection:
        if not self.space:
            raise ValueError("tune.space names no key to sweep")
        if self.search == "grid":
            sampled = [k for k, d in self.space.items() if d.kind != "grid"]
            if sampled:
                raise ValueError(
                    f"search=grid, but {', '.join(sampled)} are sampled, not grids; use "
                    "search=random or give them as grid: [...]"
                )
        return self

    def param_space(self) -> dict[str, Any]:
        """Ray Tune's ``param_space``: flat dotted keys, each a Tune domain."""
        return {key: domain.to_tune() for key, domain in self.space.items()}
