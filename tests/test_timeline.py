"""``RAYSIM_TIMELINE``: each process's spans, for ``benchmarks/timeline.py``."""

from __future__ import annotations

import os

from raysim.actors.local import local_core
from raysim.config import load_config
from raysim.tracking import timeline
from tests.conftest import tiny


def test_the_timeline_records_each_round_s_spans_only_when_asked(tmp_path, monkeypatch):
    """Off (the default) a run writes nothing; on, the coordinator's spans carry their rounds,
    in order, one file per process, and ``read`` returns them by start time."""
    cfg = load_config(tiny(rounds=3, tracking={"enabled": False}))
    monkeypatch.delenv(timeline.ENV, raising=False)
    core = local_core(cfg)
    while not core.done:
        core.step()
    assert timeline.span("x") is timeline.span("y")  # the shared no-op
    folder = tmp_path / "spans"
    monkeypatch.setenv(timeline.ENV, str(folder))
    timeline.role("coordinator")
    core = local_core(cfg)
    while not core.done:
        core.step()
    spans = timeline.read(folder)
    assert [p.name for p in folder.iterdir()] == [f"{os.getpid()}.jsonl"]
    assert {s["role"] for s in spans} == {"coordinator"}
    dispatch = [s["round"] for s in spans if s["name"] == "dispatch"]
    assert dispatch == [0, 1, 2]
    waits = [s for s in spans if s["name"] == "result wait"]
    assert len(waits) == 3 * 5  # one a job: 5 clients a round
    assert all(s["end"] >= s["start"] for s in spans)
    assert [s["start"] for s in spans] == sorted(s["start"] for s in spans)
