"""One run's MLflow writer: per-round metrics, params, artifacts (the coordinator is the only
writer)."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from raysim.tracking import timeline
from raysim.tracking.artifacts import _import_plotting, plot_curves, rows_csv, write_clients_csv
from raysim.tracking.store import RESTRICTED_TAG, ensure_experiment, open_store
from raysim.util.private_files import make_private

log = logging.getLogger("raysim")


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
        then name it current (tag ``raysim.state.checkpoint``, the commit), then remove the older
        ones: a failure on the way leaves the previous checkpoint current and whole."""
        self.flush()
        folder = f"checkpoint/{name}"
        for path in sorted(files, key=lambda f: Path(f).name == "meta.json"):
            make_private(path)  # a local artifact store copies the file's mode
            self.client.log_artifact(self.run_id, path, folder)
        self.client.set_tag(self.run_id, "raysim.state.checkpoint", name)
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
