"""The MLflow store: where it is, opening it, its schema and experiments (the coordinator is the
only writer)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from raysim.util.private_files import new_private_file

log = logging.getLogger("raysim")


def default_tracking_uri(cwd: str | Path | None = None) -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else sqlite ``mlflow.db`` in the working dir."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path(cwd or os.getcwd()).resolve() / 'mlflow.db'}"


#: MLflow 3's UI opens an experiment in its GenAI view unless this tag says model training
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"


#: set on a run that logged server-private values (FedBaF's ``log_private``)
RESTRICTED_TAG = "raysim.restricted"

#: hosts that name this machine only
LOOPBACK = ("localhost", "::1")


def node_local(uri: str) -> bool:
    """True for a store only this node reaches: a sqlite or file path, or a server (tracking,
    database) on a loopback address. Another node that opens the same URI opens another store."""
    from urllib.parse import urlparse

    parsed = urlparse(uri)
    if uri.split(":")[0] in ("databricks", "databricks-uc"):
        return False
    if parsed.scheme in ("", "file", "sqlite"):
        return True
    host = parsed.hostname or ""
    return not host or host in LOOPBACK or host.startswith("127.")


def store_path(uri: str) -> Path | None:
    """Where a local store lives on disk: the sqlite file, or the file store's directory; None
    for a server."""
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///"))
    if uri.startswith("file:") or ("://" not in uri and not uri.startswith("databricks")):
        return Path(uri.removeprefix("file://").removeprefix("file:"))
    return None


def store_lock(uri: str) -> Any:
    """An inter-process lock for a local store (sqlite file or file store), so that runs that
    start together do not race on its creation; a no-op for a tracking server."""
    import contextlib

    from filelock import FileLock

    path = store_path(uri)
    if path is None:
        return contextlib.nullcontext()
    if not uri.startswith("sqlite:"):
        path = path / ".raysim"  # a file store is a directory
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path) + ".lock", timeout=300)


def quiet_mlflow() -> None:
    """No INFO lines from MLflow or its schema migrations (a fresh store's "Creating initial
    MLflow database tables"). After ``import mlflow``, which sets its loggers to INFO."""
    import mlflow  # noqa: F401

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def open_store(uri: str) -> Any:
    """An ``MlflowClient`` on ``uri`` whose store is ready: a fresh store creates and migrates
    its schema on first use, under ``store_lock`` so that runs starting together never race (a
    fresh sqlite store whole or not at all: ``create_sqlite_schema``); a sqlite store that was
    copied or moved has its artifact paths repointed (``relocate_store``)."""
    from mlflow.tracking import MlflowClient

    quiet_mlflow()
    with store_lock(uri):
        path = store_path(uri) if uri.startswith("sqlite:///") else None
        if path is not None and (not path.exists() or path.stat().st_size == 0):
            create_sqlite_schema(path)
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)
        for note in relocate_store(uri):
            log.warning(note)
    return client


def create_sqlite_schema(path: Path) -> None:
    """MLflow's schema for a fresh sqlite store at ``path``, made in a file beside it and moved
    into place once complete. A process killed while MLflow migrates a store in place (about
    2 s on 2 vCPUs) leaves some tables made and others not, a store no later run can open
    ("table … already exists"); killed here, it leaves only the side file, made anew next time.
    The side file is a copy of ``schema_template`` where that can be had: MLflow's migrations
    then run once per machine and MLflow version, not once per store.

    The store is made 0600 whatever the umask (sqlite keeps an existing file's mode, and its
    journals copy it); an empty file the user made in its place keeps its own mode."""
    side = path.with_name(f".{path.name}.creating")
    side.unlink(missing_ok=True)
    new_private_file(side)
    if path.exists():
        shutil.copymode(path, side)
    template = schema_template()
    if template is not None:
        shutil.copyfile(template, side)
    else:
        _migrate(side)
    os.replace(side, path)


def schema_template() -> Path | None:
    """An empty sqlite store at the newest schema of the installed MLflow, in raysim's cache
    (``machine.cache_home``), made on first use the same way as a store
    (beside, then moved into place); None where the cache cannot be written. MLflow's
    migrations write no time or machine into it: only its schema, its version and the default
    workspace's row (the Default experiment is made by the store that opens a copy)."""
    import mlflow

    from raysim.util.machine import cache_home

    home = cache_home()  # (the module's version: mlflow-skinny has no "mlflow" distribution)
    template = home / f"mlflow-{mlflow.__version__}-empty.db"
    if template.is_file():
        return template
    side = template.with_name(f".{template.name}.{os.getpid()}.creating")
    try:
        home.mkdir(parents=True, exist_ok=True)
        _migrate(side)
        os.replace(side, template)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            side.unlink(missing_ok=True)
    return template


def _migrate(path: Path) -> None:
    """MLflow's tables and migrations into a new sqlite file at ``path``."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()


#: Run tag: the driver session that opened the run (a replacement coordinator finds it by this)
SESSION_TAG = "raysim.session"

#: Run tag: the Ray node the coordinator ran on (where a node-local store must be)
NODE_TAG = "raysim.coordinator_node"

#: Experiment tag: the directory of the sqlite store the experiment was created in
STORE_HOME = "raysim.store_home"


def _store_home(uri: str) -> Path | None:
    path = store_path(uri) if uri.startswith("sqlite:") else None
    return None if path is None else path.resolve().parent


#: where MLflow's sqlite store keeps artifact locations
_ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
)


def _moved_from(recorded: str | None, path: str, home: Path) -> str | None:
    """The directory an experiment's artifacts live under, if the store has since moved from it
    to ``home``: the recorded home; for an experiment without one, the directory above a
    ``mlruns/`` that is gone there and present here. None when nothing moved."""
    old = recorded
    if old is None:
        if not path.startswith("/") or "/mlruns/" not in path or Path(path).exists():
            return None
        old, tail = path.split("/mlruns/", 1)
        if not (home / "mlruns" / tail).exists():
            return None
    old = old.rstrip("/")
    return None if old == str(home) or not path.startswith(old + "/") else old


def relocate_store(uri: str) -> list[str]:
    """Repoint artifact paths of a sqlite store that was copied or moved to another directory.

    MLflow records absolute artifact paths, so a copied project directory would read (and
    write) the artifacts of the old one. Each raysim experiment carries the directory its store
    lived in (``STORE_HOME``); where that differs from where the store is now, every artifact path
    under the old directory is rewritten to the same place under the new one. Experiments made
    before the tag existed are repointed only when their old artifact directory is gone and the
    same ``mlruns/...`` path exists here. Returns one note per experiment repointed.
    """
    import sqlite3
    from contextlib import closing

    home = _store_home(uri)
    if home is None or not (home / Path(uri).name).exists():
        return []
    notes = []
    with closing(sqlite3.connect(home / Path(uri).name, timeout=60)) as db, db:
        query = "SELECT experiment_id, value FROM experiment_tags WHERE key = ?"
        recorded = dict(db.execute(query, (STORE_HOME,)))
        for exp_id, location in list(
            db.execute("SELECT experiment_id, artifact_location FROM experiments")
        ):
            old = _moved_from(recorded.get(exp_id), location.removeprefix("file://"), home)
            if old is None:
                continue
            for table, column in _ARTIFACT_COLUMNS:
                for scheme in ("", "file://"):
                    prefix = f"{scheme}{old}/"
                    db.execute(
                        f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                        f"WHERE experiment_id = ? AND substr({column}, 1, ?) = ?",
                        (f"{scheme}{home}/", len(prefix) + 1, exp_id, len(prefix), prefix),
                    )
            db.execute(
                "INSERT OR REPLACE INTO experiment_tags (key, value, experiment_id) "
                "VALUES (?, ?, ?)",
                (STORE_HOME, str(home), exp_id),
            )
            notes.append(
                f"store moved: artifacts of experiment {exp_id} now read from {home}, not {old}"
            )
    if notes:  # MLflow caches each run's artifact location per process
        from mlflow.tracking._tracking_service import utils

        getattr(utils, "_artifact_repos_cache", {}).clear()
    return notes


def ensure_experiment(client: Any, name: str) -> str:
    """The id of experiment ``name``, created if missing; safe when runs create it together."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is None:
        tags = {EXPERIMENT_KIND: MODEL_TRAINING}
        home = _store_home(client.tracking_uri)
        if home is not None:
            tags[STORE_HOME] = str(home)
        try:
            return client.create_experiment(name, tags=tags)
        except MlflowException:
            exp = client.get_experiment_by_name(name)  # another run created it in between
            if exp is None:
                raise
    if EXPERIMENT_KIND not in exp.tags:  # made before raysim tagged its experiments
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND, MODEL_TRAINING)
    return exp.experiment_id
