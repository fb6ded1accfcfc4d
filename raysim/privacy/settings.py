"""The ``privacy:`` section of a config (torch-free and Ray-free: every runtime reads it).

User-level differential privacy for methods whose server step is a weighted sum of their clients'
deltas (``raysim methods NAME`` says ``updates: summed``):

- ``central``: DP-FedAvg (McMahan et al. 2018, "Learning Differentially Private Recurrent Language
  Models", https://arxiv.org/abs/1710.06963). Each client's delta is clipped to L2 norm C on its
  worker; the server adds Gaussian noise of standard deviation z·C to the clipped sum once per
  aggregation and divides by a fixed denominator (the expected number of updates of one
  aggregation, not the number that arrived: §2, the "fixed-denominator estimator"); clients count
  equally (the paper's w_k = 1).
- ``local``: each client adds Gaussian noise of standard deviation z·C to its own clipped delta
  before sending it; the server sums as it would without privacy.

``adaptive`` clipping follows a target quantile of the update norms (Andrew et al. 2021,
"Differentially Private Learning with Adaptive Clipping", https://arxiv.org/abs/1905.03871).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from raysim.schema import StrictModel


class AdaptiveClipping(StrictModel):
    """C follows the ``target_quantile`` of the clients' update norms (Andrew et al. 2021, Alg. 1):
    each client also reports whether its norm was within C, the server sums those bits with
    Gaussian noise of std ``count_stddev`` and moves C geometrically:
    ``C ← C·exp(−learning_rate·(b̄ − target_quantile))``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False, description="adapt C to the update norms each aggregation (central mode only)"
    )
    target_quantile: float = Field(0.5, gt=0, lt=1, description="γ, the quantile C tracks")
    learning_rate: float = Field(0.2, gt=0, description="η_C of the geometric update")
    count_stddev: float | None = Field(
        None,
        gt=0,
        description="σ_b, the noise on the count of clients within C; default: the expected "
        "clients per aggregation / 20 (the paper's choice)",
    )


class PrivacyAudit(StrictModel):
    """A one-run audit beside the run (Steinke, Nasr and Jagielski 2023): ``canaries`` clients
    of the population become canaries, each taking part with probability 1/2 (a fixed random
    direction of norm C as its update) or not (a zero update); at the run's end the canaries
    whose directions best and worst match the model's change are guessed in and out, and the
    correct guesses give an empirical lower bound on ε (``raysim.privacy.audit``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    canaries: int = Field(0, ge=0, description="m, canary clients (0: no audit)")
    guesses: int | None = Field(
        None,
        ge=2,
        description="r, the canaries guessed: half in (the highest scores), half out (the "
        "lowest); default m/5",
    )
    confidence: float = Field(
        0.95, gt=0, lt=1, description="the confidence level of the lower bound on ε"
    )

    def split(self) -> tuple[int, int]:
        """(k+, k−): the guesses in and out, fixed before any score is seen."""
        r = self.guesses if self.guesses is not None else max(2, self.canaries // 5)
        return r - r // 2, r // 2


class SecureAggregation(StrictModel):
    """Secure aggregation's effects, simulated (no cryptography; ``raysim.privacy.secagg``): each
    client's clipped delta is encoded in fixed point (``scale_bits`` fraction bits) and the
    server learns only the sum modulo 2^``modulus_bits`` of the clients that did not drop out;
    a round whose survivors fall below ``threshold`` of its clients yields no update (SecAgg+).
    A sum that could wrap is refused before the run starts. Its traffic is logged per round."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False, description="simulate secure aggregation of the clipped deltas (central mode only)"
    )
    modulus_bits: int = Field(32, ge=8, le=62, description="k: sums are taken modulo 2^k")
    scale_bits: int = Field(16, ge=0, description="f: a value x is encoded as rint(x·2^f)")
    threshold: float = Field(
        0.5, gt=0, le=1, description="the fraction of a round's clients that must survive"
    )
    dropout: float = Field(
        0.0, ge=0, lt=1, description="the chance that a client drops out of a round's protocol"
    )
    protocol: Literal["secagg", "secagg_plus"] = Field(
        "secagg_plus",
        description="the cost model: secagg (Bonawitz et al. 2017, every pair of clients) or "
        "secagg_plus (Bell et al. 2020, O(log n) neighbours)",
    )
    noise: Literal["server", "skellam", "discrete_gaussian"] = Field(
        "server",
        description="who adds the noise: server (the central Gaussian on the unmasked sum), or "
        "distributed DP: each client adds integer noise of this kind to its encoded delta, "
        "sized so that a round's surviving shares carry z·C (the server adds none)",
    )

    @model_validator(mode="after")
    def _fraction_fits(self) -> SecureAggregation:
        if self.scale_bits >= self.modulus_bits:
            raise ValueError(
                f"privacy.secure_aggregation.scale_bits ({self.scale_bits}) must be below "
                f"modulus_bits ({self.modulus_bits})"
            )
        return self


class PrivacyConfig(StrictModel):
    """User-level differential privacy of a run; off by default (``mode: none``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    mode: Literal["none", "central", "local"] = Field(
        "none",
        description="central: DP-FedAvg, clipped deltas and Gaussian noise on their sum at the "
        "server; local: each client noises its own clipped delta; none: no privacy",
    )
    clip: float = Field(1.0, gt=0, description="C, the L2 norm every client's delta is clipped to")
    noise_multiplier: float = Field(
        1.0,
        ge=0,
        description="z: the noise's standard deviation is z·C (central: on the sum of an "
        "aggregation; local: on each client's delta)",
    )
    target_epsilon: float | None = Field(
        None,
        gt=0,
        description="central: choose z before the first round so that ε after all planned "
        "rounds is this target (noise_multiplier is then ignored); refused in one line where "
        "no z up to max_noise_multiplier reaches it",
    )
    max_noise_multiplier: float = Field(100.0, gt=0, description="target_epsilon's search limit")
    delta: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="δ of (ε, δ)-DP; default 1/N^1.1 for N = clients.num (below 1/N, as is usual)",
    )
    accountant: Literal["rdp", "pld"] = Field(
        "rdp",
        description="dp-accounting's Rényi (rdp) or privacy-loss-distribution (pld) accountant; "
        "pld needs clients.sampling poisson (it has no analysis of fixed-size sampling)",
    )
    epsilon_budget: float | None = Field(
        None,
        gt=0,
        description="stop the run, as a finished one, before an aggregation that would take ε "
        "past this budget",
    )
    adaptive: AdaptiveClipping = Field(
        default_factory=AdaptiveClipping,
        description="adaptive clipping: C follows a quantile of the update norms; off by default",
    )
    audit: PrivacyAudit = Field(
        default_factory=PrivacyAudit,
        description="an empirical lower bound on ε from canary clients; off by default",
    )
    secure_aggregation: SecureAggregation = Field(
        default_factory=SecureAggregation,
        description="secure aggregation's effects, simulated; off by default",
    )

    @model_validator(mode="after")
    def _consistent(self) -> PrivacyConfig:
        if self.mode == "local" and self.target_epsilon is not None:
            raise ValueError(
                "privacy.target_epsilon calibrates central noise; with mode local set "
                "privacy.noise_multiplier (each client's ε is reported per participation count)"
            )
        if self.mode == "local" and self.epsilon_budget is not None:
            raise ValueError(
                "privacy.epsilon_budget counts the server's noised sums (central DP); with mode "
                "local each client's ε is reported per participation: unset epsilon_budget"
            )
        if self.mode == "local" and self.adaptive.enabled:
            raise ValueError(
                "privacy.adaptive clips at a quantile the server estimates from all clients' "
                "noised bits (central DP); with mode local set privacy.adaptive.enabled false"
            )
        if self.secure_aggregation.enabled and self.mode != "central":
            raise ValueError(
                "privacy.secure_aggregation simulates what a server learns of its clients' "
                "clipped deltas, with central noise on the sum: set privacy.mode central"
            )
        if self.secure_aggregation.noise != "server":
            kind = self.secure_aggregation.noise
            if not self.secure_aggregation.enabled:
                raise ValueError(
                    f"privacy.secure_aggregation.noise {kind} is added inside secure "
                    "aggregation: set privacy.secure_aggregation.enabled true"
                )
            if self.accountant != "rdp":
                raise ValueError(
                    f"privacy.secure_aggregation.noise {kind} is accounted by its Rényi-DP "
                    "curve (dp-accounting's PLD has no such event): set privacy.accountant rdp"
                )
            if self.adaptive.enabled:
                raise ValueError(
                    "privacy.adaptive's count is noised by the server, which distributed DP "
                    f"(secure_aggregation.noise {kind}) leaves without noise to add: set "
                    "privacy.adaptive.enabled false"
                )
        a = self.audit
        if a.guesses is not None and a.guesses > a.canaries:
            raise ValueError(
                f"privacy.audit.guesses ({a.guesses}) exceeds privacy.audit.canaries "
                f"({a.canaries}): guess at most every canary"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def delta_for(self, num_clients: int) -> float:
        """δ: as set, else 1/N^1.1."""
        return self.delta if self.delta is not None else float(num_clients) ** -1.1


def privacy_plan_line(cfg: Any) -> str:
    """What a run's plan says of its privacy (``raysim run --dry-run``)."""
    p: PrivacyConfig = cfg.privacy
    sgd = cfg.local.dp_sgd
    sample = ""
    if sgd is not None:
        sample = (
            f"sample-level DP-SGD in every client (C_s = {sgd.clip:g}, "
            f"z_s = {sgd.noise_multiplier:g}, δ = {sgd.delta:.3g}, ε per client accounted)"
        )
    if not p.enabled:
        return sample or "none"
    z = f"ε = {p.target_epsilon:g} targeted" if p.target_epsilon else f"z = {p.noise_multiplier:g}"
    clip = f"C = {p.clip:g}" + (" (adaptive)" if p.adaptive.enabled else "")
    sampling = "Poisson" if cfg.clients.sampling == "poisson" else "fixed-size"
    parts = [f"{p.mode} DP", clip, z, f"δ = {p.delta_for(cfg.clients.num):.3g}",
             f"{p.accountant} accountant, {sampling} sampling"]  # fmt: skip
    if cfg.delays.kind != "none":
        parts.append("no amplification by sampling (delays)")
    if p.epsilon_budget is not None:
        parts.append(f"ends before ε > {p.epsilon_budget:g}")
    if p.secure_aggregation.enabled:
        noise = p.secure_aggregation.noise
        by = "" if noise == "server" else f", {noise.replace('_', ' ')} noise from the clients"
        parts.append("secure aggregation simulated" + by)
    if p.audit.canaries:
        parts.append(f"audited with {p.audit.canaries} canaries")
    return "; ".join(x for x in (", ".join(parts), sample) if x)
