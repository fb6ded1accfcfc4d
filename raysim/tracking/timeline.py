"""Where a round's wall time goes: named spans from every process of a run, for diagnosis.

Off unless the environment variable ``RAYSIM_TIMELINE`` names a folder when a process starts
(a local Ray cluster's processes inherit the driver's environment). Then each process appends
its spans to ``<folder>/<pid>.jsonl``, one JSON line per span, written as it ends (nothing is
lost when a Ray actor's process ends without Python's teardown): ``{"role", "name", "round",
"start", "end", "pid"}``, times from ``time.time()`` (one clock for every process of a machine).

``benchmarks/timeline.py`` runs the quickstart this way and tabulates the spans per round. Off,
``span`` returns one shared no-op context manager: a dictionary lookup and a call per span.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

ENV = "RAYSIM_TIMELINE"
_NOTHING = contextlib.nullcontext()


class _Recorder:
    def __init__(self, folder: str) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.pid = os.getpid()
        self.file: IO[str] = open(Path(folder) / f"{self.pid}.jsonl", "a", buffering=1)  # noqa: SIM115
        self.role = "process"

    @contextlib.contextmanager
    def span(self, name: str, round: int) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            line = {"role": self.role, "name": name, "round": round, "pid": self.pid}
            self.file.write(json.dumps({**line, "start": start, "end": time.time()}) + "\n")


_recorder: _Recorder | None = None


def _current() -> _Recorder | None:
    """This process's recorder (made on first use: a forked process gets its own file)."""
    global _recorder
    folder = os.environ.get(ENV)
    if not folder:
        return None
    if _recorder is None or _recorder.pid != os.getpid():
        _recorder = _Recorder(folder)
    return _recorder


def role(name: str) -> None:
    """Name this process in its spans (driver, coordinator, worker)."""
    recorder = _current()
    if recorder is not None:
        recorder.role = name


def span(name: str, round: int = -1) -> contextlib.AbstractContextManager[Any]:
    """A context manager that records ``name`` for ``round`` (-1: none) when the timeline is on."""
    recorder = _current()
    return _NOTHING if recorder is None else recorder.span(name, round)


def read(folder: str | Path) -> list[dict[str, Any]]:
    """Every span written under ``folder``, in start order."""
    spans = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        spans += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(spans, key=lambda s: s["start"])
