"""MLflow tracking: the coordinator is the only writer. Per-round metrics, params, artifacts."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from raysim import timeline
from raysim.private_files import make_private, new_private_file

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

    from raysim.machine import cache_home

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


class Tracker:
    """One MLflow run; a round's metrics go in one synchronous request, so a checkpoint, the end
    of the run or a failure finds every round before it in the store. Inside
    ``rounds_batched`` the rounds wait and go together, still before anything else is written.

    MLflow's asynchronous logging was tried (issue 24) and dropped: on 2 vCPUs whole runs took
    the same time, and its thread, holding the GIL for the sqlite write, slowed the coordinator's
    own work in the next round (the leak check 2.9 → 12 ms, benchmarks/RESULTS.md).

    ``resume_run_id`` reopens an existing run instead (``raysim run --resume``): its status goes
    back to RUNNING, params are left as they are, and rounds it already logged before it stopped
    are not logged again (a resumed run re-runs them bit-identically from its checkpoint), so every
    round keeps exactly one value per metric.
    """

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str | None,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
        parent_run_id: str | None = None,
        resume_run_id: str | None = None,
    ) -> None:
        self.client = open_store(uri)  # its own client: the process-wide tracking URI stays put
        # the end-of-run plot's import (0.4 s on 2 vCPUs), while the rounds wait on the workers
        threading.Thread(target=_import_plotting, daemon=True).start()
        self.uri = uri
        self.warnings: list[str] = []
        self.ended = False
        #: Rounds up to this step were logged by an earlier attempt of a resumed run.
        self.logged_through = -1
        self._batching = False
        self._unsent: list[Any] = []  # round metrics waiting for ``flush``
        self._sending = threading.Lock()  # ``flush`` may come from a stop's thread
        self._writing = threading.Lock()  # held by one write at a time, in order
        self._behind: threading.Thread | None = None  # ``rounds_batched``'s write, if any
        self._behind_error: BaseException | None = None
        if resume_run_id is not None:
            self.run_id = resume_run_id
            history = self.client.get_metric_history(resume_run_id, "round")
            self.logged_through = max((m.step for m in history), default=-1)
            self.client.update_run(resume_run_id, status="RUNNING")
            return
        exp_id = ensure_experiment(self.client, experiment)
        run_tags = dict(tags)
        if parent_run_id:
            run_tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(exp_id, run_name=run_name, tags=run_tags)
        self.run_id = run.info.run_id
        self._log_params(params)

    def _log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_round(self, step: int, metrics: Mapping[str, float], final: bool = False) -> None:
        """A round's metrics at step ``step`` (the round's number, 1 to rounds), unless an earlier
        attempt of a resumed run logged that round; ``final``: the run's end, at its last
        round's step, logged once whatever came before."""
        from mlflow.entities import Metric

        if (step <= self.logged_through and not final) or self.ended:
            return

        ts = int(time.time() * 1000)
        row = [
            Metric(k, float(v), ts, step)
            for k, v in metrics.items()
            if v is not None and np.isfinite(v)
        ]
        with self._sending:
            self._unsent += row
        if not self._batching:
            self.flush()

    @contextlib.contextmanager
    def rounds_batched(self) -> Iterator[None]:
        """Rounds logged inside reach the store together, in one request written behind: a
        thread sends them as it closes, while the next rounds run (the write took about 50 ms
        of a 0.25 s driver call on 2 vCPUs, the workers idle meanwhile). Anything written
        later (the next rounds, a checkpoint, an artifact, the run's end) waits for it, so a
        checkpoint still finds every round before it in the store. A process that dies before
        the write ends loses those rounds from the store; its replacement re-runs them from
        the last checkpoint and logs them (``logged_through``)."""
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
            self._join_behind()
            if self._unsent:
                self._behind = threading.Thread(target=self._write_behind, name="raysim-mlflow")
                self._behind.start()

    def _write_behind(self) -> None:
        try:
            self.flush()
        except BaseException as e:  # noqa: BLE001 - raised where the next write waits for it
            self._behind_error = e

    def _join_behind(self) -> None:
        """Wait for the write behind; its error, if any, is raised here."""
        if self._behind is not None and self._behind is not threading.current_thread():
            self._behind.join()
            self._behind = None
        error, self._behind_error = self._behind_error, None
        if error is not None:
            raise error

    def flush(self) -> None:
        """Send the rounds' metrics that wait, in order (MLflow takes 1000 values a request),
        after any write behind."""
        self._join_behind()
        with self._writing:
            with self._sending:
                unsent, self._unsent = self._unsent, []
            if not unsent:
                return
            with timeline.span("mlflow write"):
                for i in range(0, len(unsent), 1000):
                    self.client.log_batch(self.run_id, metrics=unsent[i : i + 1000])

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The resolved config as ``config.yaml`` now (a run that dies early still has it)."""
        self.flush()
        self.client.log_text(
            self.run_id, yaml.safe_dump(dict(config), sort_keys=False), "config.yaml"
        )

    def log_placement(self, coordinator_node: str, workers: Sequence[Mapping[str, Any]]) -> None:
        """Where the run's actors are: ``placement.json`` (the coordinator's node; each worker's
        node, process id and GPU ids, and its mode: ``actor``, or ``in_process`` for a worker
        that trains in the coordinator's process; ``early``: an actor started before the
        coordinator, by ``raysim run``'s driver or as a Tune trial's process loaded,
        ``raysim.sweeps.early``) and a ``raysim.nodes`` tag, the number of nodes its workers
        use."""
        self.flush()
        keys = ("worker", "node_id", "pid", "gpu_ids", "cuda_visible_devices")
        rows = [
            {**{k: w.get(k) for k in keys}, "mode": w.get("mode", "actor"), "early": w.get("early")}
            for w in workers
        ]
        self.client.log_dict(
            self.run_id, {"coordinator_node": coordinator_node, "workers": rows}, "placement.json"
        )
        self.client.set_tag(self.run_id, "raysim.nodes", str(len({r["node_id"] for r in rows})))

    def log_checkpoint(self, files: Sequence[str], name: str, next_round: int) -> None:
        """Upload a checkpoint's ``files`` (0600, ``meta.json`` last) to ``checkpoint/<name>/``,
        then name it current (tag ``raysim.checkpoint``, the commit), then remove the older
        ones: a failure on the way leaves the previous checkpoint current and whole."""
        self.flush()
        folder = f"checkpoint/{name}"
        for path in sorted(files, key=lambda f: Path(f).name == "meta.json"):
            make_private(path)  # a local artifact store copies the file's mode
            self.client.log_artifact(self.run_id, path, folder)
        self.client.set_tag(self.run_id, "raysim.checkpoint", name)
        self.client.set_tag(self.run_id, "raysim.checkpoint_round", str(next_round))
        self._prune_checkpoints(keep=name)

    def _prune_checkpoints(self, keep: str) -> None:
        """Delete the run's older checkpoint folders where the artifact store can (best effort:
        a store that cannot keeps them, unused)."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        with contextlib.suppress(Exception):
            repo = get_artifact_repository(self.client.get_run(self.run_id).info.artifact_uri)
            for entry in self.client.list_artifacts(self.run_id, "checkpoint"):
                name = Path(entry.path).name
                if name != keep:
                    repo.delete_artifacts(entry.path)

    def log_private(self, secrets: Sequence[Any]) -> None:
        """Server-private tensors the user asked to keep (``private/foundation.safetensors``);
        the run is tagged ``raysim.restricted`` so whoever shares it knows. The file is 0600,
        and so is its copy in a local artifact store (which copies the file's mode)."""
        from safetensors.numpy import save_file

        self.flush()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "foundation.safetensors"
            save_file({s.name: np.ascontiguousarray(s.values) for s in secrets}, str(path))
            make_private(path)  # in a 0700 temporary folder until now
            self.client.log_artifact(self.run_id, str(path), "private")
        self.client.set_tag(self.run_id, RESTRICTED_TAG, "true")

    def warn(self, message: str) -> None:
        log.warning(message)
        self.warnings.append(message)

    def set_tag(self, key: str, value: str) -> None:
        """Tag the run (after the rounds that wait)."""
        self.flush()
        self.client.set_tag(self.run_id, key, value)

    def log_dict(self, obj: Any, name: str) -> None:
        """``obj`` as the run's JSON or YAML artifact ``name`` (after the rounds that wait)."""
        self.flush()
        self.client.log_dict(self.run_id, obj, name)

    def close(self) -> None:
        """Wait for the write behind (its error is raised here)."""
        self._join_behind()

    def log_final(
        self,
        config: Mapping[str, Any],
        weights: dict[str, np.ndarray],
        client_rows: Iterable[Mapping[str, Any]],
        history: Sequence[Mapping[str, float]],
        summary: Mapping[str, Any],
        client_states: Mapping[int, Mapping[str, np.ndarray]] | None = None,
        tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
        workers: Sequence[Mapping[str, Any]] | None = None,
        client_columns: Sequence[str] | None = None,
        clients_csv: str | None = None,
    ) -> None:
        """Resolved config, weights (safetensors), per-client table (``clients.csv``, written
        row by row under ``client_columns``; default: every key of any row; or the file
        ``clients_csv``, written so already), accuracy plot,
        summary,
        the strategy's own tables (``strategy/NAME.csv``) and what each worker did
        (``workers.json``: jobs, seconds training and evaluating, peak GPU memory)."""
        self.flush()
        from safetensors.numpy import save_file

        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            (d / "config.yaml").write_text(yaml.safe_dump(dict(config), sort_keys=False))
            save_file(
                {k: np.ascontiguousarray(v) for k, v in weights.items()}, d / "weights.safetensors"
            )
            if clients_csv is not None:
                shutil.copyfile(clients_csv, d / "clients.csv")
            else:
                write_clients_csv(d / "clients.csv", client_rows, client_columns)
            stored = {j: s for j, s in (client_states or {}).items() if hasattr(s, "root")}
            if stored:  # clients.state.store: disk: where each client's last version is
                manifest = {
                    "store": next(iter(stored.values())).root,
                    "clients": {
                        str(j): {"file": s.name, "bytes": s.nbytes}
                        for j, s in sorted(stored.items())
                    },
                }
                (d / "client_states.json").write_text(json.dumps(manifest, indent=1))
            elif client_states:  # personal state (e.g. personal adapters), client-side only
                flat = {
                    f"client{j}/{name}": np.ascontiguousarray(v)
                    for j, state in sorted(client_states.items())
                    for name, v in state.items()
                }
                save_file(flat, d / "client_states.safetensors")
            (d / "summary.yaml").write_text(yaml.safe_dump(dict(summary), sort_keys=False))
            if workers:
                (d / "workers.json").write_text(json.dumps(list(workers), indent=1, default=str))
            if self.warnings:
                (d / "warnings.txt").write_text("\n".join(self.warnings) + "\n")
            plot_curves(history, d / "accuracy.png")
            if tables:
                (d / "strategy").mkdir()
                for name, rows in tables.items():
                    (d / "strategy" / f"{name}.csv").write_text(rows_csv(rows))
            for path in d.rglob("*"):  # a local artifact store copies each file's mode
                make_private(path)  # personal states, weights: as private as mlflow.db
            self.client.log_artifacts(self.run_id, str(d))
        self.client.set_terminated(self.run_id, "FINISHED")
        self.ended = True

    def fail(self, status: str = "FAILED") -> None:
        """End the run unfinished: FAILED (an error) or KILLED (interrupted, closed early)."""
        self.flush()
        self.ended = True
        self.client.set_terminated(self.run_id, status)


def rows_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """A CSV of ``rows``; its columns are every key of any row, in order of first appearance
    (a personalised run's clients that never reported yet have no scores: empty cells)."""
    if not rows:
        return ""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def write_clients_csv(
    path: Path, rows: Iterable[Mapping[str, Any]], columns: Sequence[str] | None
) -> None:
    """The per-client table, row by row under ``columns`` (default: every key of any row)."""
    if columns is None:
        rows = list(rows)
        columns = list(dict.fromkeys(k for r in rows for k in r))
    write_rows_csv(path, rows, columns)


def write_rows_csv(path: Path, rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """``rows`` written one by one under ``columns`` (none is held once written: 10^6 clients'
    rows); a key a row lacks is an empty cell."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), restval="")
        writer.writeheader()
        writer.writerows(rows)


def _import_plotting() -> Any:
    """matplotlib's pyplot, drawing to files only (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(history: Sequence[Mapping[str, float]], path: Path) -> None:
    """Accuracy (and loss) of the global model against virtual time."""
    plt = _import_plotting()

    evals = [h for h in history if "accuracy" in h]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if evals:
        t = [h["virtual_time"] for h in evals]
        ax.plot(t, [h["accuracy"] for h in evals], marker=".", label="accuracy")
        ax.set_ylim(0, 1)
        if any("loss" in h for h in evals):
            ax2 = ax.twinx()
            ax2.plot(t, [h.get("loss", np.nan) for h in evals], color="tab:red", alpha=0.5)
            ax2.set_ylabel("test loss", color="tab:red")
    ax.set_xlabel("virtual time (rounds)")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
