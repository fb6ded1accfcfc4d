"""Device traces: each client's compute speed, bandwidth and availability windows.

A ``DeviceTraces`` holds n trace entries; client c of a run uses entry ``c mod n`` (so a trace of
100 k devices serves a population of 10^6, as FedScale maps its clients onto its traces). Per
entry:

- ``compute_ms``: milliseconds of one sample's forward pass (FedScale's ``computation``, from AI
  Benchmark); a training step of b samples costs ``backward_factor·b·compute_ms`` (FedScale's
  factor 3: the backward pass costs about twice the forward);
- ``bandwidth_kbps``: kbit/s up and down (FedScale's ``communication``, from MobiPerf);
- availability: windows ``[start, end]`` in seconds within a period that repeats (FedScale's
  ``active``/``inactive`` lists and ``finish_time``); an entry without windows is never
  available; a trace without availability is always available.

Windows are stored flat (CSR: ``offsets``, ``starts``, ``ends``), so a question about m clients
costs O(m log W) whatever the population: no array over the clients is built per round.

Formats: FedScale's two pickled dicts (``fedscale.read_fedscale``) and raysim's own CSV or
Parquet files (``read_traces``/``write_traces``, documented in docs/devices.md). numpy and
pyarrow; no torch, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: the files of raysim's own trace format, in one folder
CAPACITY_FILE = "capacity"
AVAILABILITY_FILE = "availability"
CAPACITY_COLUMNS = ("client", "compute_ms", "bandwidth_kbps", "period_s")
AVAILABILITY_COLUMNS = ("client", "start_s", "end_s")


#: devices with at most this many windows are looked up by a scan of their windows, more by a
#: binary search of all of them (the scan stays in cache; the search's first levels do not)
SCAN_WINDOWS = 16


class TraceError(ValueError):
    """A trace file that cannot be used, named with its cause."""


@dataclass(frozen=True, eq=False)
class DeviceTraces:
    """n device entries (see the module docstring); ``offsets`` is None where every device is
    always available."""

    compute_ms: np.ndarray
    bandwidth_kbps: np.ndarray
    period_s: np.ndarray | None = None
    offsets: np.ndarray | None = None
    starts: np.ndarray | None = None
    ends: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.compute_ms)
        if n == 0:
            raise TraceError("a device trace needs at least one device")
        if len(self.bandwidth_kbps) != n:
            raise TraceError(f"{n} compute speeds but {len(self.bandwidth_kbps)} bandwidths")
        if not (np.all(self.compute_ms > 0) and np.all(np.isfinite(self.compute_ms))):
            raise TraceError("every device's compute_ms must be a finite number > 0")
        if not (np.all(self.bandwidth_kbps > 0) and np.all(np.isfinite(self.bandwidth_kbps))):
            raise TraceError("every device's bandwidth_kbps must be a finite number > 0")
        if self.offsets is None:
            return
        if self.period_s is None or self.starts is None or self.ends is None:
            raise TraceError("availability needs periods, offsets, starts and ends together")
        if len(self.offsets) != n + 1 or len(self.period_s) != n:
            raise TraceError("availability must cover every device of the trace")
        if not np.all(self.period_s > 0):
            raise TraceError("every device's availability period must be > 0 seconds")
        if np.any(self.ends < self.starts):
            raise TraceError("an availability window ends before it starts")
        if np.any(np.diff(self.offsets) < 0) or self.offsets[-1] != len(self.starts):
            raise TraceError("availability offsets are not a CSR index of the windows")
        owner = np.repeat(np.arange(n), np.diff(self.offsets))
        if np.any(self.starts < 0) or np.any(self.ends > self.period_s[owner] + 1e-9):
            raise TraceError("an availability window lies outside its device's period")
        order_ok = np.all((np.diff(self.starts) >= 0) | (np.diff(owner) != 0))
        if not order_ok:
            raise TraceError("a device's availability windows must be sorted by start")
        # one sorted key per window, (entry, start), for lookups of devices with many windows
        span = float(np.max(self.period_s)) * 2 + 1
        object.__setattr__(self, "_span", span)
        object.__setattr__(self, "_keys", owner * span + self.starts)
        object.__setattr__(self, "_most", int(np.max(np.diff(self.offsets), initial=0)))

    @property
    def size(self) -> int:
        return len(self.compute_ms)

    @property
    def always_available(self) -> bool:
        return self.offsets is None

    def entries(self, clients: np.ndarray) -> np.ndarray:
        """The trace entry of each client: ``c mod n``."""
        return np.asarray(clients, dtype=np.int64) % self.size

    def availability(self, clients: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray]:
        """(available, until): whether each client is available at virtual second ``t``, and
        the second its current window closes (inf where it never does)."""
        clients = np.asarray(clients, dtype=np.int64)
        if self.offsets is None:
            return np.ones(len(clients), bool), np.full(len(clients), math.inf)
        if len(self.starts) == 0:
            return np.zeros(len(clients), bool), np.full(len(clients), -math.inf)
        e = self.entries(clients)
        period = self.period_s[e]
        local = np.mod(t, period)
        lo, hi = self.offsets[e], self.offsets[e + 1]
        if self._most <= SCAN_WINDOWS:  # a few windows a device: scan them, in cache
            i = lo - 1
            last = len(self.starts) - 1
            for j in range(self._most):
                hit = (lo + j < hi) & (self.starts[np.minimum(lo + j, last)] <= local)
                i = np.where(hit, lo + j, i)
        else:  # many: a binary search of all windows by (device, start)
            i = np.searchsorted(self._keys, e * self._span + local, side="right") - 1
        inside = (i >= lo) & (i < hi)
        j = np.where(inside, i, 0)
        ok = inside & (local <= self.ends[j])
        until = np.where(ok, t + (self.ends[j] - local), -math.inf)
        # a window that runs to the period's end continues into one that starts at 0
        wraps = ok & (self.ends[j] >= period) & (hi > lo)
        if np.any(wraps):
            first = lo[wraps]
            carry = np.where(self.starts[first] <= 0, self.ends[first], 0.0)
            until[wraps] = until[wraps] + carry
        return ok, until

    def fraction_available(self) -> float:
        """The mean share of its period a device is available (1 without availability)."""
        if self.offsets is None:
            return 1.0
        owner = np.repeat(np.arange(self.size), np.diff(self.offsets))
        covered = np.bincount(owner, self.ends - self.starts, minlength=self.size)
        return float(np.mean(covered / self.period_s))


def windows(
    n: int, owner: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, starts, ends) of n devices' windows, sorted and with overlapping or touching
    windows of a device merged (a lookup reads the last window that starts before t)."""
    owner = np.asarray(owner, dtype=np.int64)
    starts, ends = np.asarray(starts, np.float64), np.asarray(ends, np.float64)
    order = np.lexsort((starts, owner))
    owner, starts, ends = owner[order], starts[order], ends[order]
    if len(owner):
        span = float(max(np.max(np.abs(ends)), np.max(np.abs(starts)))) * 2 + 1
        reach = np.maximum.accumulate(owner * span + ends)
        fresh = np.ones(len(owner), bool)
        fresh[1:] = (owner[1:] != owner[:-1]) | (owner[1:] * span + starts[1:] > reach[:-1])
        last = np.r_[np.flatnonzero(fresh)[1:], len(owner)] - 1
        owner, starts = owner[fresh], starts[fresh]
        ends = reach[last] - owner * span
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=offsets[1:])
    return offsets, starts, ends


# ----------------------------------------------------------------------------- own format
def _table_path(folder: Path, stem: str) -> Path | None:
    for ext in (".parquet", ".csv"):
        p = folder / f"{stem}{ext}"
        if p.is_file():
            return p
    return None


def _read_table(path: Path, columns: tuple[str, ...], need: int) -> dict[str, np.ndarray]:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds; one line names it
        raise TraceError(f"{path}: not a readable table ({type(e).__name__}: {e})") from None
    missing = [c for c in columns[:need] if c not in table.column_names]
    if missing:
        raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; expected {columns}")
    out = {}
    for c in columns:
        if c in table.column_names:
            col = table.column(c)
            if col.null_count:
                raise TraceError(f"{path}: column {c} has empty values")
            out[c] = col.to_numpy()
    return out


def read_traces(folder: str | Path) -> DeviceTraces:
    """raysim's own format: ``capacity.csv`` (or ``.parquet``) with columns ``client,
    compute_ms, bandwidth_kbps`` (and ``period_s`` where there is availability), and optionally
    ``availability.csv`` with ``client, start_s, end_s`` (one row per window). Clients are
    0..n-1, each once in capacity; windows lie in [0, period_s]."""
    folder = Path(folder)
    cap_path = _table_path(folder, CAPACITY_FILE)
    if cap_path is None:
        raise TraceError(f"{folder}: no {CAPACITY_FILE}.csv or {CAPACITY_FILE}.parquet")
    cap = _read_table(cap_path, CAPACITY_COLUMNS, 3)
    ids = cap["client"].astype(np.int64)
    n = len(ids)
    if n == 0 or not np.array_equal(np.sort(ids), np.arange(n)):
        raise TraceError(f"{cap_path}: clients must be 0..n-1, each once")
    order = np.argsort(ids)
    compute = cap["compute_ms"].astype(np.float64)[order]
    bandwidth = cap["bandwidth_kbps"].astype(np.float64)[order]
    av_path = _table_path(folder, AVAILABILITY_FILE)
    if av_path is None:
        return DeviceTraces(compute, bandwidth)
    if "period_s" not in cap:
        raise TraceError(f"{cap_path}: availability needs a period_s column")
    av = _read_table(av_path, AVAILABILITY_COLUMNS, 3)
    owner = av["client"].astype(np.int64)
    if len(owner) and (owner.min() < 0 or owner.max() >= n):
        raise TraceError(f"{av_path}: a window's client is not in {cap_path.name}")
    offsets, starts, ends = windows(n, owner, av["start_s"], av["end_s"])
    return DeviceTraces(
        compute, bandwidth, cap["period_s"].astype(np.float64)[order], offsets, starts, ends
    )


def write_traces(traces: DeviceTraces, folder: str | Path, fmt: str = "csv") -> Path:
    """Write ``traces`` in raysim's own format (``csv`` or ``parquet``) into ``folder``."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if fmt not in ("csv", "parquet"):
        raise ValueError(f"trace format must be csv or parquet, got {fmt!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n = traces.size
    cap = {
        "client": np.arange(n, dtype=np.int64),
        "compute_ms": traces.compute_ms,
        "bandwidth_kbps": traces.bandwidth_kbps,
    }
    tables = {}
    if traces.offsets is not None:
        cap["period_s"] = traces.period_s
        owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(traces.offsets))
        tables[AVAILABILITY_FILE] = pa.table(
            {"client": owner, "start_s": traces.starts, "end_s": traces.ends}
        )
    tables[CAPACITY_FILE] = pa.table(cap)
    for stem, table in tables.items():
        path = folder / f"{stem}.{fmt}"
        if fmt == "csv":
            pacsv.write_csv(table, path)
        else:
            pq.write_table(table, path)
    return folder
