"""The ``devices:`` section of a config: clients as devices with a speed, a bandwidth and hours
when they are available, on the virtual clock in seconds (torch-free and Ray-free).

Off by default: the clock then counts rounds and draws delays (``delays:``). On, a round lasts
at most ``deadline_s`` virtual seconds; a dispatched client downloads the model, trains and
uploads at its device's speed; only clients available at the round's start are sampled, and one
whose availability ends before it is done drops out. See docs/devices.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from raysim.schema import StrictModel


class SyntheticDevices(StrictModel):
    """The seeded generator of traces (``raysim.devices.synthetic``), the offline default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: int | None = Field(
        None, ge=1, description="trace entries (default: one per client, at most 10^6)"
    )
    compute_ms_median: float = Field(50.0, gt=0, description="ms of one sample's forward pass")
    compute_sigma: float = Field(0.6, ge=0, description="σ of log speed (FedScale's 0.6)")
    bandwidth_kbps_median: float = Field(5000.0, gt=0, description="kbit/s up and down")
    bandwidth_sigma: float = Field(1.0, ge=0, description="σ of log bandwidth")
    night_start_h: float = Field(22.0, ge=0, lt=24, description="mean hour a night window opens")
    night_start_spread_h: float = Field(
        2.0, ge=0, description="std of the night window's start, in hours"
    )
    night_hours_median: float = Field(
        7.0, gt=0, le=20, description="median length of the night window, in hours"
    )
    night_hours_sigma: float = Field(0.4, ge=0, description="σ of the log night length")
    day_session_rate: float = Field(0.3, ge=0, le=1, description="chance of a day window too")
    day_hours_median: float = Field(
        1.0, gt=0, le=10, description="median length of a day window (starts 8–18 h), in hours"
    )
    timezone_spread_h: float = Field(0.0, ge=0, le=24, description="devices' clocks spread")
    always_available: float = Field(0.0, ge=0, le=1, description="share online all day")


class DevicesConfig(StrictModel):
    """Clients as devices (issue 60); ``enabled: false`` leaves the round-counting clock."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False,
        description="clients as devices on a clock in seconds; false: rounds, with delays",
    )
    traces: Literal["synthetic", "fedscale", "files"] = Field(
        "synthetic",
        description="synthetic: the seeded generator; fedscale: FedScale's pickled dicts "
        "(capacity at path, availability at availability_path); files: raysim's own CSV or "
        "Parquet folder at path",
    )
    path: str | None = Field(None, description="fedscale: the capacity pickle; files: a folder")
    availability_path: str | None = Field(
        None, description="fedscale: client_behave_trace (none: always available)"
    )
    synthetic: SyntheticDevices = Field(
        default_factory=SyntheticDevices, description="traces synthetic: the generator's settings"
    )
    availability: bool = Field(
        True, description="respect availability windows (false: speeds and bandwidths only)"
    )
    deadline_s: float = Field(
        600.0, gt=0, description="a round's length in virtual seconds, at most"
    )
    start_s: float = Field(
        0.0, ge=0, description="virtual second of round 0 within the traces' period"
    )
    overcommit: float = Field(
        1.0,
        ge=1,
        description="sample ceil(overcommit·per_round) clients; above 1 the round closes once "
        "per_round of them have reported (FedScale's 1.3)",
    )
    close_after: int | None = Field(
        None,
        ge=1,
        description="close a round once this many clients reported (default: per_round where "
        "overcommit > 1, else only at the deadline)",
    )
    partial_work: Literal["auto", "accept", "drop"] = Field(
        "auto",
        description="a client that cannot finish its local work by the deadline: accept does "
        "the steps that fit (FedProx); drop discards it (FedAvg in FedProx's experiments); "
        "auto: the method's own default",
    )
    min_steps: int = Field(1, ge=1, description="partial work below this many steps is dropped")
    late: Literal["auto", "drop", "deliver"] = Field(
        "auto",
        description="an update done after its round closed: drop it, or deliver it in the round "
        "its completion falls in (asynchronous methods); auto: the method's own default",
    )
    backward_factor: float = Field(
        3.0, gt=0, description="a training sample costs this many forward passes (FedScale: 3)"
    )
    stragglers: float = Field(
        0.0,
        ge=0,
        le=1,
        description="FedProx's systems heterogeneity (Li et al. 2020, §5.2): this fraction of "
        "each round's sampled clients are stragglers, each with time for x ~ U{1..E-1} of its E "
        "local epochs only (then partial_work decides: accept the x epochs, or drop it)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DevicesConfig:
        if self.traces in ("fedscale", "files") and not self.path:
            raise ValueError(f"devices.traces {self.traces} reads devices.path: set it")
        if self.traces != "fedscale" and self.availability_path:
            raise ValueError(
                "devices.availability_path is FedScale's behave trace: set devices.traces "
                "fedscale, or put availability.csv in the devices.path folder"
            )
        if self.late == "deliver" and (self.close_after or self.overcommit > 1):
            raise ValueError(
                "devices.late deliver places a late update in a later round, whose length must "
                "be known: rounds that close early (close_after, overcommit) cannot; use late drop"
            )
        if self.late == "deliver" and self.partial_work == "accept":
            raise ValueError(
                "devices.late deliver lets every client finish its work, so none does partial "
                "work: set devices.partial_work auto or drop"
            )
        return self
