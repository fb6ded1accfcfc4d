"""Whole-run checkpoints: ``CoordinatorCore.state_dict()`` as files, and resuming a run from them.

With ``checkpoint.every: N`` the coordinator writes a checkpoint after round k whenever
``(k+1) % N == 0`` (not after the last round); the latest replaces the previous. It is four files
(five with a strategy's private state), and no pickle:

- ``meta.json``: format version, the next round to run, the MLflow run id, a hash of the config,
  and the sha256 of every other file. Written last and checked on load, so a checkpoint cut short
  by a crash is refused instead of half-read.
- ``config.yaml``: the resolved config of the run.
- ``arrays.safetensors``: every numeric array of the state: the model versions that in-flight
  jobs were dispatched on, every client's personal state, the strategy's moments, …
- ``state.json``: the rest (``raysim.state.codec``): the strategy's other state, the schedule's
  RNG state, the arrival queue, per-client counters, history, evaluator state. Loading it builds
  only plain values and raysim's own types, so a crafted checkpoint cannot run code.
- ``private.safetensors``: a strategy's private arrays, only ever in ``checkpoint.dir``.

They live in the run's MLflow artifacts under ``checkpoint/<name>/`` (the store of record, shared
on a cluster; the run's tag ``raysim.state.checkpoint`` names the current one) and, with
``checkpoint.dir``, in that directory (the only place when tracking is off), each written whole
before it replaces the previous one (``raysim.state.checkpoint_files``). ``prepare_resume`` checks a
resume request on the driver before Ray starts (run status, a checkpoint exists, same config);
the coordinator actor then reads the checkpoint itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from raysim.algorithms.registry import module_policy, modules_skipped
from raysim.config import ConfigError, RunConfig, flatten, load_config, with_state_store
from raysim.state import checkpoint_files
from raysim.state.checkpoint_files import fsync_file, sha256_file
from raysim.state.codec import StateCodecError, decode, encode
from raysim.util.private_files import new_private_file, private_dir

#: 3: no pickle (state.json, ``raysim.state.codec``); 2 pickled the state's skeleton.
FORMAT_VERSION = 3
#: Artifact folder of a run's checkpoint in MLflow.
ARTIFACT_PATH = "checkpoint"
META, CONFIG, ARRAYS, STATE = "meta.json", "config.yaml", "arrays.safetensors", "state.json"
#: The run tag that names the current checkpoint's folder under ``ARTIFACT_PATH``.
CHECKPOINT_TAG = "raysim.state.checkpoint"
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
def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stage(
    folder: str | Path,
    state: Mapping[str, Any],
    config: RunConfig | Mapping[str, Any],
    round: int,
    run_id: str | None = None,
    private: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Write a checkpoint's files into ``folder`` (new or empty), each streamed to disk, 0600 and
    fsynced, ``meta.json`` last; returns the meta. ``round`` is the next round to run.
    ``private`` arrays (a strategy's private state) go to their own file."""
    from safetensors.numpy import save_file

    d = private_dir(folder)
    cfg = config.to_dict() if isinstance(config, RunConfig) else dict(config)
    arrays: dict[str, np.ndarray] = {}
    tree = encode(dict(state), arrays)
    written = {
        CONFIG: lambda path: path.write_text(yaml.safe_dump(cfg, sort_keys=False)),
        STATE: lambda path: path.write_text(json.dumps(tree, separators=(",", ":"))),
        ARRAYS: lambda path: save_file(arrays, str(path)),
    }
    if private:
        contiguous = {k: np.ascontiguousarray(v) for k, v in private.items()}
        written[PRIVATE] = lambda path: save_file(contiguous, str(path))
    digests = {}
    for name, write in written.items():
        path = d / name
        new_private_file(path)  # 0600 before a byte is in it
        try:
            write(path)
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - safetensors reports a full disk as its own error
            raise OSError(f"{name}: {e}") from e
        fsync_file(path)
        digests[name] = sha256_file(path)
    meta = {
        "format": FORMAT_VERSION,
        "round": int(round),
        "run_id": run_id,
        "config_hash": config_hash(cfg),
        "files": digests,
    }
    new_private_file(d / META)
    (d / META).write_text(json.dumps(meta, indent=1))
    fsync_file(d / META)
    return meta


def pack(
    state: Mapping[str, Any],
    config: RunConfig | Mapping[str, Any],
    round: int,
    run_id: str | None = None,
    private: Mapping[str, np.ndarray] | None = None,
) -> dict[str, bytes]:
    """A checkpoint as ``{file name: bytes}`` (``stage``'s files, read back)."""
    with tempfile.TemporaryDirectory(prefix="raysim-pack-") as tmp:
        stage(Path(tmp) / "c", state, config, round, run_id, private)
        return {p.name: p.read_bytes() for p in (Path(tmp) / "c").iterdir()}


def read_meta(data: bytes, where: str) -> dict[str, Any]:
    try:
        meta = json.loads(data)
    except ValueError:
        raise ResumeError(f"{where}: meta.json of the checkpoint is not valid JSON") from None
    if meta.get("format") == 2:
        raise ResumeError(
            f"{where}: a checkpoint of format 2 keeps the run's state as a pickle (state.pkl), "
            "which this raysim never loads: unpickling runs whatever code the file names. "
            "Resume it with the raysim that wrote it, or start the run again"
        )
    if meta.get("format") != FORMAT_VERSION:
        raise ResumeError(
            f"{where}: checkpoint format {meta.get('format')!r}; this raysim reads format "
            f"{FORMAT_VERSION} (start the run again)"
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
    try:
        state = decode(json.loads(files[STATE]), load(files[ARRAYS]))
    except (StateCodecError, KeyError, ValueError, TypeError) as e:
        raise ResumeError(f"{where}: the checkpoint's state cannot be read ({e})") from None
    state["private"] = load(files[PRIVATE]) if PRIVATE in files else {}
    return meta, state


def write_dir(path: str | Path, files: Mapping[str, bytes]) -> Path:
    """Make ``files`` (``pack``'s) the current checkpoint of folder ``path``: written whole into
    a new subfolder, then swapped in (``checkpoint_files.commit``)."""
    root = private_dir(path)
    staged = checkpoint_files.staging(root)
    try:
        for name in sorted(files, key=lambda n: n == META):
            new_private_file(staged / name)
            (staged / name).write_bytes(files[name])
            fsync_file(staged / name)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    meta = json.loads(files[META]) if META in files else {}
    return checkpoint_files.commit(root, staged, int(meta.get("round", 0)))


def read_dir(
    path: str | Path, names: Iterable[str] = (META, CONFIG, ARRAYS, STATE, PRIVATE)
) -> dict:
    """The current checkpoint's files in folder ``path`` (or in a checkpoint subfolder named
    directly); a folder of the old layout (files at the top) is read as it is, and refused by
    ``read_meta``."""
    d = checkpoint_files.current(path) or Path(path)
    return {name: (d / name).read_bytes() for name in names if (d / name).is_file()}


def read_mlflow(
    uri: str, run_id: str, names: Iterable[str] = (META, CONFIG, ARRAYS, STATE)
) -> dict[str, bytes]:
    """The named files of an MLflow run's current checkpoint (absent ones are left out): the
    folder its ``raysim.state.checkpoint`` tag names (set once the folder is whole)."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no bar per file
    client = MlflowClient(tracking_uri=uri)
    name = client.get_run(run_id).data.tags.get(CHECKPOINT_TAG)
    if name is not None and not checkpoint_files.FOLDER.match(name):
        raise ResumeError(f"run {run_id}: its {CHECKPOINT_TAG} tag is not a checkpoint name")
    folder = f"{ARTIFACT_PATH}/{name}" if name else ARTIFACT_PATH
    present = {Path(f.path).name for f in client.list_artifacts(run_id, folder)}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for file in names:
            if file in present:
                local = client.download_artifacts(run_id, f"{folder}/{file}", tmp)
                out[file] = Path(local).read_bytes()
    return out


class CheckpointNotWritten(RuntimeError):
    """No destination took the checkpoint (a full disk, a locked tracking store, …); the
    previous one stands."""


#: Tries of a tracking-store call around a checkpoint, and the pause before each retry (s).
TRACKING_TRIES, TRACKING_PAUSE_S = 3, 0.5


def _retried(call: Any, what: str) -> Any:
    """``call()``, tried ``TRACKING_TRIES`` times (a sqlite store "database is locked", a
    server's hiccup); the last error is raised."""
    for attempt in range(TRACKING_TRIES):
        try:
            return call()
        except Exception:  # noqa: BLE001 - any store error; the last one is raised
            if attempt == TRACKING_TRIES - 1:
                raise
            time.sleep(TRACKING_PAUSE_S * 2**attempt)
    raise AssertionError(what)  # pragma: no cover


class Checkpointer:
    """Writes the coordinator's checkpoints to MLflow (through the tracker) and/or a directory,
    whose lock it holds from the start (``checkpoint_files.acquire``)."""

    def __init__(self, cfg: RunConfig, tracker: Any | None = None) -> None:
        self.every = cfg.checkpoint.every
        self.dir = cfg.checkpoint.dir
        self.rounds = cfg.rounds
        self.config = cfg.to_dict()
        self.tracker = tracker
        self._lock = checkpoint_files.acquire(self.dir) if self.dir else None

    def close(self) -> None:
        """Release ``checkpoint.dir`` (also released when the process ends)."""
        if self._lock is not None:
            checkpoint_files.release(self._lock)
            self._lock = None

    def due(self, next_round: int) -> bool:
        """After round ``next_round - 1``; never after the last round (the run finishes)."""
        return bool(self.every) and next_round % self.every == 0 and next_round < self.rounds

    def save(
        self,
        state: Mapping[str, Any],
        next_round: int,
        private: Mapping[str, np.ndarray] | None = None,
    ) -> bool:
        """Write a checkpoint; True if every destination has it, False if ``checkpoint.dir``
        has it but the tracking store does not (a warning says why). Raises
        ``CheckpointNotWritten`` if none has it. ``private`` arrays are written to
        ``checkpoint.dir`` only, never to MLflow (docs/papers/fedbaf.md: private server state is not
        logged as an artifact)."""
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
        if self.dir:
            folder = self._to_dir(state, next_round, run_id, private)
            if self.tracker is None:
                return True
            try:
                self._to_tracking(folder, next_round)
            except Exception as e:  # noqa: BLE001 - reported; the folder's copy stands
                self.tracker.warn(
                    f"checkpoint before round {next_round} is in {self.dir} but not in the "
                    f"tracking store ({_one_line(e)}); the store's previous one stands"
                )
                return False
            return True
        with tempfile.TemporaryDirectory(prefix="raysim-ckpt-") as tmp:
            folder = Path(tmp) / "c"
            try:
                stage(folder, state, self.config, next_round, run_id)
            except OSError as e:
                raise CheckpointNotWritten(f"cannot stage it ({_one_line(e)})") from e
            try:
                self._to_tracking(folder, next_round)
            except Exception as e:  # noqa: BLE001 - a tracking store's error, whatever it is
                raise CheckpointNotWritten(f"the tracking store refused it ({_one_line(e)})") from e
        return True

    def _to_dir(
        self,
        state: Mapping[str, Any],
        next_round: int,
        run_id: str | None,
        private: Mapping[str, np.ndarray] | None,
    ) -> Path:
        root = Path(self.dir)
        try:
            staged = checkpoint_files.staging(root)
        except OSError as e:
            raise CheckpointNotWritten(f"{root}: {_one_line(e)}") from e
        try:
            stage(staged, state, self.config, next_round, run_id, private)
        except OSError as e:
            shutil.rmtree(staged, ignore_errors=True)
            raise CheckpointNotWritten(f"{root}: {_one_line(e)}") from e
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        try:
            return checkpoint_files.commit(root, staged, next_round)
        except OSError as e:
            raise CheckpointNotWritten(f"{root}: {_one_line(e)}") from e

    def _to_tracking(self, folder: Path, next_round: int) -> None:
        tracker = self.tracker
        _retried(tracker.flush, "flush")  # the rounds a checkpoint covers are in the store first
        files = [str(folder / n) for n in (CONFIG, ARRAYS, STATE, META) if (folder / n).is_file()]
        name = checkpoint_files.folder_name(next_round)
        _retried(lambda: tracker.log_checkpoint(files, name, next_round), "log_checkpoint")


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


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
    trust_modules: bool = False,
) -> ResumeSource:
    """Check a resume request before Ray starts. ``resume`` is an MLflow run id or a checkpoint
    directory. Without ``config`` the checkpoint's own config is used (``overrides`` apply to it);
    with one, it must match the checkpoint's except for ``RESUME_FREE`` keys. A module that only
    the checkpoint's config names is imported only with ``trust_modules`` (never in a dry run:
    ``registry.module_policy``)."""
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
    if given is not None:
        cfg = given
    else:
        with _stored_config_policy(trust_modules, f"the checkpoint of {where}"):
            cfg = load_config(stored, overrides)
    cfg = store_as_checkpointed(cfg, stored)
    if not same_config(cfg, meta, files):
        with module_policy("skip"):  # compared, never run
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


def store_as_checkpointed(cfg: RunConfig, stored: Any) -> RunConfig:
    """``cfg`` with the personal-state store of the checkpointed run (its config as stored,
    ``stored``) where ``cfg`` says ``clients.state.store: auto``: the states are where that
    run's plan put them (its checkpoint's config has ``memory`` or ``disk``; one written before
    ``auto`` existed, or without the key, had the default then, ``memory``). An explicit store
    is compared as it is: ``memory`` against a checkpoint's ``disk`` is another run."""
    if cfg.clients.state.store != "auto":
        return cfg
    section = stored.get("clients") if isinstance(stored, Mapping) else None
    state = section.get("state") if isinstance(section, Mapping) else None
    then = state.get("store", "memory") if isinstance(state, Mapping) else "memory"
    return with_state_store(cfg, then) if then in ("memory", "disk") else cfg


def _stored_config_policy(trust: bool, source: str) -> Any:
    """How to validate a config read from a checkpoint or a tracking store: its modules are
    imported only if the user trusts it, and never in a dry run."""
    if modules_skipped():
        return contextlib.nullcontext()
    return module_policy("import" if trust else "refuse", source)


def _default_uri() -> str:
    from raysim.tracking.store import default_tracking_uri

    return default_tracking_uri()


def load(source: Mapping[str, Any], config: RunConfig) -> dict[str, Any]:
    """The coordinator's side: read the checkpoint named by ``ResumeSource.for_actor()``."""
    if source.get("dir"):
        where = str(source["dir"])
        files = read_dir(source["dir"])
    else:
        where = f"run {source['run_id']}"
        files = read_mlflow(source["tracking_uri"], source["run_id"])
        if config.checkpoint.dir:
            files.update(read_dir(config.checkpoint.dir, (PRIVATE,)))
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
        with module_policy("skip"):  # compared, never run
            then = load_config(yaml.safe_load(files[CONFIG]))
    except ConfigError:
        return False
    # a checkpoint's ``auto`` (one a plan did not write) is whichever store ``config`` resumes with
    return config_hash(_store_of(then, config)) == config_hash(_store_of(config, then))


def _store_of(config: RunConfig, other: RunConfig) -> RunConfig:
    """``config`` with ``other``'s concrete store where its own is ``auto``."""
    store = other.clients.state.store
    if config.clients.state.store == "auto" and store != "auto":
        return with_state_store(config, store)
    return config
