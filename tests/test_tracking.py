"""Tracking store selection and the accuracy plot (`raysim ui`: tests/test_ui_browser.py)."""

from __future__ import annotations

import threading

import pytest

from raysim.tracking.artifacts import plot_curves, rows_csv
from raysim.tracking.store import default_tracking_uri, schema_template


def test_env_tracking_uri_overrides_default(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere/x.db")
    assert default_tracking_uri(tmp_path) == "sqlite:////elsewhere/x.db"


def test_accuracy_plot_is_a_png(tmp_path):
    hist = [{"virtual_time": t + 1.0, "accuracy": 0.1 * t, "loss": 2.0 - 0.1 * t} for t in range(8)]
    plot_curves(hist, tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_client_table_takes_every_column_of_any_row():
    """Personalised async runs: clients that have not reported yet have no scores (the first
    row may lack columns a later row has); the table keeps them all, with empty cells."""
    rows = [{"client": 0, "samples": 3}, {"client": 1, "samples": 4, "accuracy": 0.5}]
    assert rows_csv(rows).splitlines() == ["client,samples,accuracy", "0,3,", "1,4,0.5"]


def test_clients_csv_is_written_row_by_row(tmp_path):
    """Issue 43: a table of 10^5 clients' rows goes to ``clients.csv`` as they are made (the
    rows held at once would be tens of MB); a row without a later column has an empty cell."""
    import csv
    import tracemalloc

    from raysim.tracking.artifacts import write_rows_csv

    def rows():
        for j in range(100_000):
            yield {"client": j, "loss": j / 7} | ({"accuracy": 0.5} if j == 3 else {})

    tracemalloc.start()
    try:
        write_rows_csv(tmp_path / "c.csv", rows(), ["client", "loss", "accuracy"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, peak
    with open(tmp_path / "c.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 100_000 and table[3]["accuracy"] == "0.5" and table[4]["accuracy"] == ""
    assert float(table[99_999]["loss"]) == 99_999 / 7


def test_batched_rounds_reach_the_store_together_and_before_a_checkpoint(tmp_path):
    """Inside ``rounds_batched`` (a driver call's rounds, ``Coordinator.advance``) the rounds
    wait and go in one request; a checkpoint written meanwhile, to MLflow or to a directory
    only, finds every round before it in the store. Outside, each round goes at once."""
    from raysim.config import load_config
    from raysim.state.checkpoint import Checkpointer
    from raysim.tracking.tracker import Tracker
    from tests.conftest import tiny

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    t = Tracker(uri, "batched", "run", {}, {})

    def steps() -> list[int]:
        return [m.step for m in t.client.get_metric_history(t.run_id, "accuracy")]

    t.log_round(0, {"accuracy": 0.1})
    assert steps() == [0]
    cfg = load_config(tiny(checkpoint={"every": 1, "dir": str(tmp_path / "ck")}))
    with t.rounds_batched():
        t.log_round(1, {"accuracy": 0.2})
        t.log_round(2, {"accuracy": 0.3})
        assert steps() == [0]  # waiting
        Checkpointer(cfg, None).save({"core": {}}, 3)  # no tracker: nothing to flush
        assert steps() == [0]
        Checkpointer(cfg, t).save({"core": {}}, 3)
        assert steps() == [0, 1, 2]
        t.log_round(3, {"accuracy": 0.4})
    t.flush()  # the block's rounds went behind; a flush waits for them
    assert steps() == [0, 1, 2, 3]

    # the write goes behind: the block ends while it is under way, the next write waits for it
    gate, real = threading.Event(), t.client.log_batch
    t.client.log_batch = lambda *a, **k: gate.wait(30) and real(*a, **k)
    with t.rounds_batched():
        t.log_round(4, {"accuracy": 0.5})
    assert steps() == [0, 1, 2, 3]  # under way
    gate.set()
    t.flush()
    assert steps() == [0, 1, 2, 3, 4]

    # a write behind that fails raises where the next write waits for it
    t.client.log_batch = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
    with t.rounds_batched():
        t.log_round(5, {"accuracy": 0.6})
    with pytest.raises(OSError, match="disk full"):
        t.flush()
    t.client.log_batch = real
    with t.rounds_batched():
        t.log_round(6, {"accuracy": 0.7})
        t.fail("KILLED")
    assert steps() == [0, 1, 2, 3, 4, 6]
    assert t.client.get_run(t.run_id).info.status == "KILLED"


def test_a_store_whose_creation_was_cut_short_is_not_left_half_made(tmp_path, monkeypatch):
    """A coordinator killed while MLflow migrated a fresh sqlite store left some tables made
    and others not; every later run then failed ("table … already exists"; found by
    benchmarks/reliability.py). The schema is now made beside the store and moved into place
    whole (``create_sqlite_schema``): cut short, it leaves no store, and the next open works.
    The control: a half-made store at the path cannot be opened."""
    import mlflow.store.db.utils as db_utils
    import pytest
    import sqlalchemy
    from mlflow.store.db.base_sql_model import Base

    from raysim.tracking.store import open_store

    def half(engine):
        Base.metadata.tables["experiments"].create(engine)
        raise KeyboardInterrupt  # the process dies here

    broken = tmp_path / "broken.db"
    half_engine = sqlalchemy.create_engine(f"sqlite:///{broken}")
    with pytest.raises(KeyboardInterrupt):
        half(half_engine)
    half_engine.dispose()
    with pytest.raises(sqlalchemy.exc.OperationalError):
        open_store(f"sqlite:///{broken}")

    cache = tmp_path / "cache"  # no schema template yet: this store's creation makes one
    monkeypatch.setenv("RAYSIM_CACHE", str(cache))
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    with monkeypatch.context() as m:
        m.setattr(db_utils, "_initialize_tables", half)
        with pytest.raises(KeyboardInterrupt):
            open_store(uri)
    assert not (tmp_path / "m.db").exists()
    assert not list(cache.iterdir())  # nor a half-made template
    client = open_store(uri)
    assert [e.name for e in client.search_experiments()] == ["Default"]
    assert not (tmp_path / ".m.db.creating").exists()
    assert [p.name for p in cache.iterdir()] == [schema_template().name]


def test_fresh_stores_are_copies_of_one_schema_made_once(tmp_path, monkeypatch):
    """MLflow's migrations (about 1–2 s) run once per machine and MLflow version, into
    ``schema_template``; each fresh store after that is a copy, which a run writes to as to a
    migrated one. Where the cache cannot be written, the store is migrated in place of a copy."""
    import mlflow.store.db.utils as db_utils
    import pytest

    from raysim.tracking.store import open_store

    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path / "cache"))
    open_store(f"sqlite:///{tmp_path / 'first.db'}")
    template = schema_template()
    assert template is not None and template.is_file()

    def migrations(engine):
        raise AssertionError("migrated again")

    with monkeypatch.context() as m:
        m.setattr(db_utils, "_initialize_tables", migrations)
        client = open_store(f"sqlite:///{tmp_path / 'second.db'}")
        exp = client.create_experiment("e")
        run = client.create_run(exp)
        client.log_metric(run.info.run_id, "loss", 0.5, step=1)
        assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}
        assert [e.name for e in client.search_experiments()] == ["e", "Default"]
        template.unlink()  # the control: without a template, a fresh store is migrated
        with pytest.raises(AssertionError, match="migrated again"):
            open_store(f"sqlite:///{tmp_path / 'third.db'}")

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("RAYSIM_CACHE", str(blocked))
    assert schema_template() is None
    client = open_store(f"sqlite:///{tmp_path / 'fourth.db'}")
    assert [e.name for e in client.search_experiments()] == ["Default"]
