"""The ``robust`` section: which Byzantine-robust rule replaces the server's mean (torch-free).

A rule other than ``none`` and ``norm_bound`` reads every update of a round, so the updates
travel whole to the coordinator (no partial sums on the workers); ``norm_bound`` clips each
update on its worker and leaves the method's own mean. ``raysim.robust.rules`` has the rules
and their papers; docs/robustness.md says how to choose.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from raysim.schema import StrictModel

Rule = Literal[
    "none",
    "krum",
    "multi_krum",
    "median",
    "trimmed_mean",
    "bulyan",
    "geometric_median",
    "centered_clipping",
    "norm_bound",
]


class KrumSettings(StrictModel):
    m: int | None = Field(
        None, ge=1, description="multi_krum: updates averaged (None: n − f, El Mhamdi et al.'s)"
    )
    neighbours: Literal["paper", "byzfl"] = Field(
        "paper",
        description="a score sums the squared distances to the n − f − 2 nearest updates "
        "(paper: Blanchard et al. §4) or the n − f − 1 nearest (byzfl); krum, multi_krum, bulyan",
    )


class GeometricMedianSettings(StrictModel):
    nu: float = Field(1e-6, gt=0, description="ν, the smoothing of Weiszfeld's weights (RFA)")
    iterations: int = Field(100, ge=1, description="at most this many Weiszfeld steps")
    tolerance: float = Field(
        1e-6, ge=0, description="stop when a step moves v less than this·(1 + ‖v‖)"
    )
    init: Literal["mean", "zero"] = Field(
        "mean", description="start from the weighted mean (RFA) or the origin (byzfl)"
    )
    weighted: bool = Field(
        True, description="α_i ∝ the client's samples (RFA, Pillutla et al. §3); false: equal"
    )


class CenteredClippingSettings(StrictModel):
    tau: float = Field(10.0, gt=0, description="τ, the clipping radius around the centre")
    iterations: int = Field(1, ge=1, description="L (Karimireddy et al. use 1)")
    centre: Literal["previous", "zero"] = Field(
        "previous",
        description="previous: the last round's aggregate (the paper's momentum); zero: byzfl's",
    )


class NormBoundSettings(StrictModel):
    max_norm: float = Field(1.0, gt=0, description="M: each update is scaled to norm ≤ M")


class RobustConfig(StrictModel):
    """``rule``: what replaces the server's mean of the round's client deltas; ``f``: the
    adversaries per round it is set to tolerate (each rule refuses an f its paper does not
    cover, for the round's n = clients.per_round)."""

    rule: Rule = Field(
        "none",
        description="the robust aggregation rule (docs/robustness.md); norm_bound clips each "
        "update and keeps the method's mean; none: the method's own",
    )
    f: int = Field(0, ge=0, description="adversaries per round the rule tolerates")
    krum: KrumSettings = Field(
        default_factory=KrumSettings, description="krum, multi_krum and bulyan's options"
    )
    geometric_median: GeometricMedianSettings = Field(
        default_factory=GeometricMedianSettings, description="geometric_median's options (RFA)"
    )
    centered_clipping: CenteredClippingSettings = Field(
        default_factory=CenteredClippingSettings, description="centered_clipping's options"
    )
    norm_bound: NormBoundSettings = Field(
        default_factory=NormBoundSettings, description="norm_bound's options"
    )

    @property
    def enabled(self) -> bool:
        return self.rule != "none"

    @property
    def reads_each_update(self) -> bool:
        """Whether the server needs every update whole (all rules but norm_bound)."""
        return self.rule not in ("none", "norm_bound")


def robust_plan_line(cfg: Any) -> str:
    """The dry run's ``robust:`` line ("" where the run has no rule and no forging attacker)."""
    r = cfg.robust
    forging = cfg.forging_behaviours()
    if not r.enabled and not forging:
        return ""
    parts = []
    if r.rule == "norm_bound":
        parts.append(f"norm_bound: each update clipped to {r.norm_bound.max_norm:g} on its worker")
    elif r.enabled:
        parts.append(
            f"{r.rule} of each round's {cfg.clients.per_round} updates, tolerating f = {r.f}; "
            "updates travel whole to the coordinator"
        )
    if forging:
        parts.append(
            f"{', '.join(forging)} forged on the server from the round's benign updates "
            "(an omniscient attacker)"
        )
    return "; ".join(parts)
