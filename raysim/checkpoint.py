"""Whole-run checkpoints: ``CoordinatorCore.state_dict()`` as files, and resuming a run from them.

With ``checkpoint.every: N`` the coordinator writes a checkpoint after round k whenever
``(k+1) % N == 0`` (not after the last round); the latest replaces the previous. It is four files:

- ``meta.json``: format version, the next round to run, the MLflow run id, a hash of the config,
  and the sha256 of every other file. Written last and checked on load, so a checkpoint cut short
  by a crash is refused instead of half-read.
- ``config.yaml``: the resolved config of the run.
- ``arrays.safetensors``: every numeric array of the state's nested dicts: the model versions that
  in-flight jobs were dispatched on, and every client's personal state.
- ``state.pkl``: the rest, pickled: the ``Strategy`` object (server moments, FedBuff buffer, …),
  the schedule's RNG state, the arrival queue, per-client counters, history, evaluator state.
  Resuming unpickles it: resume only from a store you trust.

They live in the run's MLflow artifacts under ``checkpoint/`` (the store of record, shared on a
cluster) and, with ``checkpoint.dir``, in that directory (the only place when tracking is off).
``prepare_resume`` checks a resume request on the driver before Ray starts (run status, a
checkpoint exists, same config); the coordinator actor then reads the checkpoint itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from raysim.config import ConfigError, RunConfig, flatten, load_config

#: 2: the strategy is saved through ``Strategy.state_dict()`` (format 1 pickled it whole).
FORMAT_VERSION = 2
#: Artifact folder of a run's checkpoint in MLflow.
ARTIFACT_PATH = "checkpoint"
META, CONFIG, ARRAYS, STATE = "meta.json", "config.yaml", "arrays.safetensors", "state.pkl"
#: A strategy's private arrays (``Strategy.private_state``): only ever in ``checkpoint.dir``.
PRIVATE = "private.safetensors"
#: Config keys that may differ between a checkpoint and its resumption: they place the run on a
#: cluster or say where it is recorded, never what it computes (results do not depend on the
#: number of workers, see docs/execution.md, "Runtime"). Every other key must match.
RESUME_FREE = (
    "workers.count",
    "workers.num_cpus",
    "workers.max_restarts",
    "coordinator",
    "checkpoint",
    "tracking.uri",
    "tracking.experiment",
    "tracking.run_name",
    "tracking.parent_run_id",
    "tracking.tags",
    "tune",
    "runtime",
)
_SAFETENSORS_DTYPES = {
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
}


class ResumeError(ConfigError):
    """A resume request that cannot be honoured (unknown run, no checkpoint, other config, …)."""


# --------------------------------------------------------------------------- config identity
def _is_free(key: str) -> bool:
    return any(key == p or key.startswith(p + ".") for p in RESUME_FREE)


def fingerprint(config: RunConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The flattened config without the ``RESUME_FREE`` keys."""
    d = config.to_dict() if isinstance(config, RunConfig) else dict(config)
    return {k: v for k, v in flatten(d).items() if not _is_free(k)}


def config_hash(config: RunConfig | Mapping[str, Any]) -> str:
    blob = json.dumps(fingerprint(config), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def config_diff(
    stored: RunConfig | Mapping[str, Any], given: RunConfig | Mapping[str, Any]
) -> list[str]:
    """One line per key whose value differs (keys that only one side has included)."""
    a, b = fingerprint(stored), fingerprint(given)
    missing = object()
    lines = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            show = lambda v: "(absent)" if v is missing else repr(v)  # noqa: E731
            lines.append(f"{key}: checkpoint has {show(va)}, given {show(vb)}")
    return lines


# --------------------------------------------------------------------------- (de)serialisation
@dataclass(frozen=True)
class _ArrayRef:
    """Placeholder left in the pickled skeleton for an array stored in the safetensors file."""

    key: str


def _split(obj: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(obj, dict):
        return {k: _split(v, f"{path}/{k}" if path else str(k), arrays) for k, v in obj.items()}
    if isinstance(obj, np.ndarray) and obj.ndim and obj.dtype.name in _SAFETENSORS_DTYPES:
        key = path
        while key in arrays:  # e.g. keys 1 and "1" side by side
            key += "'"
        arrays[key] = np.ascontiguousarray(obj)
        return _ArrayRef(key)
    return obj


def _join(obj: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(obj, dict):
        return {k: _join(v, arrays) for k, v in obj.items()}
    if isinstance(obj, _ArrayRef):
        return arrays[obj.key]
    return obj


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(
    state: Mapping[str, Any],
    config: RunConfig | Mapping[str, Any],
    round: int,
    run_id: str | None = None,
    private: Mapping[str, np.ndarray] | None = None,
) -> dict[str, bytes]:
    """A checkpoint as ``{file name: bytes}``; ``round`` is the next round to run.

    ``private`` arrays (a strategy's private state) go to their own safetensors file, never
    into the pickle."""
    from safetensors.numpy import save

    cfg = config.to_dict() if isinstance(config, RunConfig) else dict(config)
    arrays: dict[str, np.ndarray] = {}
    skeleton = _split(dict(state), "", arrays)
    files = {
        CONFIG: yaml.safe_dump(cfg, sort_keys=False).encode(),
        ARRAYS: save(arrays),
        STATE: pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL),
    }
    if private:
        files[PRIVATE] = save({k: np.ascontiguousarray(v) for k, v in private.items()})
    meta = {
        "format": FORMAT_VERSION,
        "round": int(round),
        "run_id": run_id,
        "config_hash": config_hash(cfg),
        "files": {name: _sha256(data) for name, data in files.items()},
    }
    files[META] = json.dumps(meta, indent=1).encode()
    return files


def read_meta(data: bytes, where: str) -> dict[str, Any]:
    try:
        meta = json.loads(data)
    except ValueError:
        raise ResumeError(f"{where}: meta.json of the checkpoint is not valid JSON") from None
    if meta.get("format") != FORMAT_VERSION:
        raise ResumeError(
            f"{where}: checkpoint format {meta.get('format')!r}; this raysim reads format "
            f"{FORMAT_VERSION} (checkpoints written before the method-interface change of "
            "raysim's issue 8 cannot be resumed: start the run again)"
        )
    return meta


def unpack(files: Mapping[str, bytes], where: str = "checkpoint") -> tuple[dict, dict]:
    """``(meta, state)`` of a checkpoint; refuses files that do not match ``meta.json``."""
    from safetensors.numpy import load

    if META not in files:
        raise ResumeError(f"{where}: no checkpoint (meta.json missing)")
    meta = read_meta(files[META], where)
    for name, digest in meta["files"].items():
        if name not in files or _sha256(files[name]) != digest:
            raise ResumeError(
                f"{where}: checkpoint file {name} is missing or does not match meta.json (a "
                "write cut short?)"
            )
    arrays = load(files[ARRAYS])
    state = _join(pickle.loads(files[STATE]), arrays)
    state["private"] = load(files[PRIVATE]) if PRIVATE in files else {}
    return meta, state


def write_dir(path: str | Path, files: Mapping[str, bytes]) -> None:
    """Write a checkpoint into ``path``, each file atomically, ``meta.json`` last."""
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    for name in sorted(files, key=lambda n: n == META):
        tmp = d / f".{name}.tmp"
        tmp.write_bytes(files[name])
        os.replace(tmp, d / name)


def read_dir(
    path: str | Path, names: Iterable[str] = (META, CONFIG, ARRAYS, STATE, PRIVATE)
) -> dict:
    d = Path(path)
    return {name: (d / name).read_bytes() for name in names if (d / name).is_file()}


def read_mlflow(
    uri: str, run_id: str, names: Iterable[str] = (META, CONFIG, ARRAYS, STATE)
) -> dict[str, bytes]:
    """The named checkpoint files of an MLflow run (absent ones are left out)."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no bar per file
    client = MlflowClient(tracking_uri=uri)
    present = {Path(f.path).name for f in client.list_artifacts(run_id, ARTIFACT_PATH)}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            if name in present:
                local = client.download_artifacts(run_id, f"{ARTIFACT_PATH}/{name}", tmp)
                out[name] = Path(local).read_bytes()
    return out


class Checkpointer:
    """Writes the coordinator's checkpoints to MLflow (through the tracker) and/or a directory."""

    def __init__(self, cfg: RunConfig, tracker: Any | None = None) -> None:
        self.every = cfg.checkpoint.every
        self.dir = cfg.checkpoint.dir
        self.rounds = cfg.rounds
        self.config = cfg.to_dict()
        self.tracker = tracker

    def due(self, next_round: int) -> bool:
        """After round ``next_round - 1``; never after the last round (the run finishes)."""
        return bool(self.every) and next_round % self.every == 0 and next_round < self.rounds

    def save(
        self,
        state: Mapping[str, Any],
        next_round: int,
        private: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Write a checkpoint. ``private`` arrays are written to ``checkpoint.dir`` only, never
        to MLflow (fedbaf.md §7.1: private server state is not logged as an artifact)."""
        if not self.dir and self.tracker is None:
            raise RuntimeError(
                "nowhere to write a checkpoint: tracking is off and no checkpoint.dir"
            )
        if private and not self.dir:
            raise RuntimeError(
                "the strategy keeps private server state that setup() cannot rebuild; private "
                "state is never logged to MLflow, so set checkpoint.dir to checkpoint this run"
            )
        run_id = self.tracker.run_id if self.tracker is not None else None
        if self.tracker is not None:
            self.tracker.flush()  # the rounds a checkpoint covers are in the store first
        files = pack(state, self.config, next_round, run_id, private)
        if self.dir:
            write_dir(self.dir, files)
        if self.tracker is not None:
            self.tracker.log_checkpoint(
                {k: v for k, v in files.items() if k != PRIVATE}, next_round
            )


# --------------------------------------------------------------------------- resuming
@dataclass(frozen=True)
class ResumeSource:
    """A checked resume request: the config to run and where its checkpoint is."""

    config: RunConfig
    round: int  # the next round to run
    run_id: str | None  # the MLflow run to reopen (None: tracking disabled)
    dir: str | None  # the checkpoint directory (None: read from the MLflow run)
    tracking_uri: str | None

    def for_actor(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "dir": self.dir, "tracking_uri": self.tracking_uri}


def _mlflow_run(uri: str, run_id: str, force: bool) -> Any:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise ResumeError(  # do not create an empty store just to find nothing in it
            f"no MLflow run {run_id!r}: the store {uri} does not exist (nor is there a "
            "checkpoint directory of that name)"
        )
    try:
        run = MlflowClient(tracking_uri=uri).get_run(run_id)
    except MlflowException:
        raise ResumeError(
            f"no MLflow run {run_id!r} in {uri} (nor a checkpoint directory of that name)"
        ) from None
    status = run.info.status
    if status == "FINISHED":
        raise ResumeError(f"run {run_id} is already FINISHED; there is nothing to resume")
    if status == "RUNNING" and not force:
        raise ResumeError(
            f"run {run_id} is still RUNNING: a driver may be running it. If it died without "
            "marking the run (kill -9, a lost machine), resume with --force (force=True)"
        )
    return run


def prepare_resume(
    resume: str | os.PathLike,
    config: str | Path | Mapping[str, Any] | RunConfig | None = None,
    overrides: Iterable[str] = (),
    *,
    force: bool = False,
) -> ResumeSource:
    """Check a resume request before Ray starts. ``resume`` is an MLflow run id or a checkpoint
    directory. Without ``config`` the checkpoint's own config is used (``overrides`` apply to it);
    with one, it must match the checkpoint's except for ``RESUME_FREE`` keys."""
    given = None
    if config is not None:
        given = load_config(config, overrides)
        overrides = ()
    path = Path(os.fspath(resume)).expanduser()
    run = None
    if path.is_dir():
        where, directory, uri = str(path), str(path), None
        files = read_dir(path, (META, CONFIG))
        if META not in files:
            raise ResumeError(f"{path} holds no checkpoint (no {META})")
    elif os.sep in str(resume) or str(resume).startswith("."):
        raise ResumeError(f"no checkpoint directory {path}")
    else:
        run_id = str(resume)
        uri = (given.tracking.uri if given is not None else None) or _default_uri()
        run = _mlflow_run(uri, run_id, force)
        where, directory = f"run {run_id}", None
        files = read_mlflow(uri, run_id, (META, CONFIG))
        if META not in files:
            every = run.data.params.get("checkpoint.every", "0")
            raise ResumeError(
                f"run {run_id} has no checkpoint (checkpoint.every={every}: it ran without "
                "checkpoints or stopped before the first one); start it again instead"
            )
    meta = read_meta(files[META], where)
    stored = yaml.safe_load(files[CONFIG])
    cfg = given if given is not None else load_config(stored, overrides)
    if not same_config(cfg, meta, files):
        diff = config_diff(load_config(stored), cfg)
        raise ResumeError(
            f"{where}: the config differs from the checkpointed run's:\n  "
            + "\n  ".join(diff[:20] or ["(config hash differs)"])
        )
    run_id = meta.get("run_id")
    if cfg.tracking.enabled:
        if run_id is None:
            raise ResumeError(f"{where}: the checkpoint names no MLflow run")
        if run is None:
            uri = cfg.tracking.uri or _default_uri()
            run = _mlflow_run(uri, run_id, force)
    else:
        run_id, uri = None, None
    return ResumeSource(cfg, int(meta["round"]), run_id, directory, uri)


def _default_uri() -> str:
    from raysim.tracking import default_tracking_uri

    return default_tracking_uri()


def load(source: Mapping[str, Any], config: RunConfig) -> dict[str, Any]:
    """The coordinator's side: read the checkpoint named by ``ResumeSource.for_actor()``."""
    if source.get("dir"):
        where = str(source["dir"])
        files = read_dir(source["dir"])
    else:
        where = f"run {source['run_id']}"
        files = read_mlflow(source["tracking_uri"], source["run_id"])
        if config.checkpoint.dir and (Path(config.checkpoint.dir) / PRIVATE).is_file():
            files[PRIVATE] = (Path(config.checkpoint.dir) / PRIVATE).read_bytes()
    meta, state = unpack(files, where)
    if not same_config(config, meta, files):
        raise ResumeError(f"{where}: the checkpoint was written by another config")
    return state


def same_config(config: RunConfig, meta: Mapping[str, Any], files: Mapping[str, bytes]) -> bool:
    """Whether ``config`` is the checkpointed run's. The checkpoint's own config is also read
    through today's schema, so keys added to raysim since it was written (at their defaults) do
    not make an older checkpoint another run's."""
    if config_hash(config) == meta["config_hash"]:
        return True
    if CONFIG not in files:
        return False
    try:
        then = load_config(yaml.safe_load(files[CONFIG]))
    except ConfigError:
        return False
    return config_hash(then) == config_hash(config)
