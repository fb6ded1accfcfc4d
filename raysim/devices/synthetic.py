"""Seeded synthetic device traces, the offline stand-in for FedScale's (which cannot be
downloaded here): per device a log-normal compute speed and bandwidth, and a daily availability
pattern (a night window while charging, sometimes a short day window).

What it matches, by construction: FedScale's log-normal spread of device speed (its
``get_completion_time_lognormal`` draws speed factors ``exp(N(1, 0.6))``: σ = 0.6), speeds and
bandwidths of the scale of FedScale's published entries (tens of ms a sample, Mbit/s links), and
the diurnal shape FedScale reports of its availability trace (136 k phones over a week, a device
available while it charges, most of them at night). What it does not: the real traces' joint
distribution (fast devices online more, say), weekly patterns, and the exact distribution of
session lengths; every parameter is a config field, so a user can fit them to a trace of their
own or read the trace itself.
"""

from __future__ import annotations

import numpy as np

from .traces import DeviceTraces, windows

DAY_S = 86_400.0
HOUR_S = 3_600.0


def synthetic_traces(
    devices: int,
    seed: int,
    *,
    compute_ms_median: float = 50.0,
    compute_sigma: float = 0.6,
    bandwidth_kbps_median: float = 5_000.0,
    bandwidth_sigma: float = 1.0,
    night_start_h: float = 22.0,
    night_start_spread_h: float = 2.0,
    night_hours_median: float = 7.0,
    night_hours_sigma: float = 0.4,
    day_session_rate: float = 0.3,
    day_hours_median: float = 1.0,
    timezone_spread_h: float = 0.0,
    always_available: float = 0.0,
) -> DeviceTraces:
    """``devices`` entries from ``seed``: compute ms/sample ~ LogNormal(log median, σ), bandwidth
    likewise; availability over a one-day period: a night window starting N(night_start,
    spread²) hours, lasting LogNormal(log night_hours_median, night_hours_sigma) hours (at most
    20), plus with probability ``day_session_rate`` a day window starting U(8, 18) hours lasting
    LogNormal(log day_hours_median, 0.5) hours; each device's clock shifted by U(0,
    timezone_spread_h) hours; a fraction ``always_available`` is online all day."""
    if devices < 1:
        raise ValueError(f"synthetic traces need at least one device, got {devices}")
    rng = np.random.default_rng([seed, 0xDE71CE])
    compute = compute_ms_median * np.exp(compute_sigma * rng.standard_normal(devices))
    bandwidth = bandwidth_kbps_median * np.exp(bandwidth_sigma * rng.standard_normal(devices))
    shift = rng.uniform(0.0, timezone_spread_h, devices) * HOUR_S if timezone_spread_h else 0.0
    night_on = (night_start_h + night_start_spread_h * rng.standard_normal(devices)) * HOUR_S
    night_len = night_hours_median * np.exp(night_hours_sigma * rng.standard_normal(devices))
    night_len = np.minimum(night_len, 20.0) * HOUR_S
    day = rng.random(devices) < day_session_rate
    day_on = rng.uniform(8.0, 18.0, devices) * HOUR_S
    day_len = day_hours_median * np.exp(0.5 * rng.standard_normal(devices)) * HOUR_S
    always = rng.random(devices) < always_available
    ids = np.arange(devices)
    owner = [ids[~always], ids[day & ~always], ids[always]]
    on = [night_on[~always], day_on[day & ~always], np.zeros(int(always.sum()))]
    length = [night_len[~always], day_len[day & ~always], np.full(int(always.sum()), DAY_S)]
    owner, on, length = (np.concatenate(a) for a in (owner, on, length))
    on = np.mod(on + (shift[owner] if timezone_spread_h else 0.0), DAY_S)
    off = on + np.minimum(length, DAY_S)
    # a window past midnight becomes two: [on, day end] and [0, off - day]
    wraps = off > DAY_S
    owner = np.concatenate([owner, owner[wraps]])
    starts = np.concatenate([on, np.zeros(int(wraps.sum()))])
    ends = np.concatenate([np.minimum(off, DAY_S), off[wraps] - DAY_S])
    offsets, starts, ends = windows(devices, owner, starts, ends)
    return DeviceTraces(compute, bandwidth, np.full(devices, DAY_S), offsets, starts, ends)
