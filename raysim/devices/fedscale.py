"""FedScale's device traces, read without running code from the files.

FedScale (Lai et al., *FedScale: Benchmarking Model and System Performance of Federated Learning
at Scale*, ICML 2022, https://arxiv.org/abs/2105.11367) ships two pickled dicts, keyed by client
id (its ``benchmark/dataset/data/device_info``):

- ``client_device_capacity``: ``{id: {"computation": ms per sample, "communication": kbit/s}}``;
- ``client_behave_trace``: ``{id: {"active": [s, ...], "inactive": [s, ...], "finish_time": s,
  "duration": s, "model": str}}``: the device is available from ``active[i]`` to
  ``inactive[i]``, and the pattern repeats every ``finish_time`` seconds.

A pickle can run code when loaded, so these are loaded with an unpickler that refuses every
global: only the plain containers and numbers those files hold (dict, list, int, float, str)
can be built. Entries are taken in ascending id order; the capacity's and the availability's
i-th entries form device i (FedScale pairs them the same way, by position modulo their sizes).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from .traces import DeviceTraces, TraceError, windows

#: a pickle larger than this is refused before it is read (FedScale's are ~50 MB)
MAX_PICKLE_BYTES = 2 << 30


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, numbers and strings only: any class or function a pickle
    names (the way a pickle runs code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise TraceError(
            f"the pickle names {module}.{name}; a FedScale trace holds plain dicts and lists "
            "only, so it is refused (convert it with a Python you trust if it is yours)"
        )


def load_plain_pickle(path: str | Path) -> Any:
    """A pickle of plain containers, loaded without running anything it names."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    size = path.stat().st_size
    if size > MAX_PICKLE_BYTES:
        raise TraceError(f"{path}: {size} bytes, above the {MAX_PICKLE_BYTES} a trace may have")
    try:
        return _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except TraceError as e:
        raise TraceError(f"{path}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: one line
        raise TraceError(f"{path}: not a readable pickle ({type(e).__name__}: {e})") from None


def _as_dict(obj: Any, path: Path, what: str) -> dict:
    if not isinstance(obj, dict) or not obj:
        raise TraceError(f"{path}: expected FedScale's {what}, a non-empty dict keyed by client id")
    return obj


def read_fedscale(capacity: str | Path, availability: str | Path | None = None) -> DeviceTraces:
    """FedScale's ``client_device_capacity`` (and ``client_behave_trace``) as ``DeviceTraces``;
    with both, the trace has as many devices as the shorter file."""
    capacity = Path(capacity)
    cap = _as_dict(load_plain_pickle(capacity), capacity, "client_device_capacity")
    try:
        rows = [cap[k] for k in sorted(cap)]
        compute = np.array([float(r["computation"]) for r in rows])
        bandwidth = np.array([float(r["communication"]) for r in rows])
    except (KeyError, TypeError, ValueError) as e:
        raise TraceError(
            f"{capacity}: an entry lacks a number for 'computation' or 'communication' ({e})"
        ) from None
    if availability is None:
        return DeviceTraces(compute, bandwidth)
    availability = Path(availability)
    behave = _as_dict(load_plain_pickle(availability), availability, "client_behave_trace")
    traces = [behave[k] for k in sorted(behave)]
    n = min(len(rows), len(traces))
    periods = np.zeros(n)
    owner, starts, ends = [], [], []
    for i, t in enumerate(traces[:n]):
        try:
            period = float(t["finish_time"])
            on = np.asarray(t["active"], dtype=np.float64)
            off = np.asarray(t["inactive"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(
                f"{availability}: entry {i} lacks 'active', 'inactive' or 'finish_time' ({e})"
            ) from None
        if on.shape != off.shape or on.ndim != 1:
            raise TraceError(f"{availability}: entry {i} has unequal 'active' and 'inactive'")
        keep = on < period  # FedScale's lookups never reach a window past the period
        periods[i] = period
        owner.append(np.full(int(keep.sum()), i))
        starts.append(on[keep])
        ends.append(np.minimum(off[keep], period))
    offsets, s, e = windows(n, *(np.concatenate(a) for a in (owner, starts, ends)))
    return DeviceTraces(compute[:n], bandwidth[:n], periods, offsets, s, e)
