"""Where a checkpoint's files live, written so that the last good one always survives.

A checkpoint folder (``checkpoint.dir``) holds one complete checkpoint per subfolder
(``round-000012-<random>/``) and ``LATEST``, the name of the current one:

1. the new checkpoint is written into a fresh, uniquely named folder beside it, each file
   fsynced, ``meta.json`` (the hashes of the others) last;
2. the folder is renamed into place and the parent fsynced;
3. ``LATEST`` is replaced atomically (a fsynced temp file renamed over it): the commit;
4. only then are older checkpoints removed.

A crash or a full disk at any step leaves ``LATEST`` naming a complete checkpoint. A lock
(``.raysim.lock``, held by the process that writes) refuses a second run on the same folder,
and the folder never holds anything outside its subfolders, ``LATEST`` and the lock (a user's
``config.yaml`` beside it is left alone). Every file is 0600, every folder 0700.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import IO

from raysim.config import ConfigError
from raysim.util.private_files import fsync_dir, private_dir, write_private

LATEST, LOCK = "LATEST", ".raysim.lock"
#: A checkpoint subfolder's name: the next round to run, then a random part.
FOLDER = re.compile(r"^round-\d{6,}-[0-9a-f]{8}$")
_STAGING = ".writing-"


class CheckpointDirBusy(ConfigError):
    """Another run writes its checkpoints to the same folder."""


def folder_name(next_round: int) -> str:
    return f"round-{next_round:06d}-{os.urandom(4).hex()}"


def sha256_file(path: Path) -> str:
    """The file's sha256, read in 1 MiB pieces (a checkpoint is never held whole in memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def current(root: str | os.PathLike) -> Path | None:
    """The complete checkpoint ``LATEST`` names in ``root``; None if there is none."""
    latest = Path(root) / LATEST
    try:
        name = latest.read_text().strip()
    except FileNotFoundError:
        return None
    if not FOLDER.match(name):  # never a path of the file's choosing
        raise ConfigError(f"{latest}: not a checkpoint name ({name[:40]!r})")
    return Path(root) / name


def staging(root: Path) -> Path:
    """A new, empty, private folder in ``root`` to write a checkpoint into."""
    private_dir(root)
    return Path(tempfile.mkdtemp(prefix=_STAGING, dir=root))


def commit(root: Path, staged: Path, next_round: int) -> Path:
    """Move a fully written ``staged`` folder into place and make it the current checkpoint;
    older ones are removed afterwards. On error the current checkpoint is unchanged."""
    try:
        fsync_dir(staged)
        final = root / folder_name(next_round)
        os.rename(staged, final)
        fsync_dir(root)
        write_private(root / LATEST, final.name.encode())
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    prune(root, keep=final.name)
    return final


def prune(root: Path, keep: str) -> None:
    """Remove every checkpoint but ``keep`` and any half-written folder (best effort)."""
    for entry in root.iterdir():
        if entry.name != keep and (FOLDER.match(entry.name) or entry.name.startswith(_STAGING)):
            shutil.rmtree(entry, ignore_errors=True)


# --------------------------------------------------------------------------- the folder's lock
_HELD: dict[str, tuple[IO[str], int]] = {}  # real path → (lock file, holders in this process)
_HELD_LOCK = threading.Lock()


def _who(f: IO[str]) -> str:
    with contextlib.suppress(OSError):
        f.seek(0)
        return f.read().strip() or "another process"
    return "another process"


def acquire(root: str | os.PathLike) -> str:
    """Hold ``root``'s lock for this process (POSIX record lock: free again when the process
    ends, however it ends); refuse in one line if another process holds it. Returns the key
    for ``release``."""
    d = private_dir(root)
    key = os.path.realpath(d)
    with _HELD_LOCK:
        if key in _HELD:  # a run of this process before, or its resumption: one lock
            f, n = _HELD[key]
            _HELD[key] = (f, n + 1)
            return key
        fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        f = os.fdopen(fd, "r+")
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            who = _who(f)
            f.close()
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise
            raise CheckpointDirBusy(busy_message(d, who)) from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        _HELD[key] = (f, 1)
        return key


def release(key: str) -> None:
    with _HELD_LOCK:
        held = _HELD.get(key)
        if held is None:
            return
        f, n = held
        if n > 1:
            _HELD[key] = (f, n - 1)
            return
        del _HELD[key]
        f.close()  # closing the only descriptor drops the lock


def busy_message(root: Path, who: str) -> str:
    return (
        f"checkpoint.dir {root} is in use by another run ({who}): give each run its own "
        "checkpoint.dir, or wait until that run ends"
    )


def check_free(root: str | os.PathLike) -> None:
    """Refuse, before anything starts, a folder whose lock another process holds; creates
    nothing (a dry run writes nothing)."""
    path = Path(root) / LOCK
    if os.path.realpath(Path(root)) in _HELD:
        return
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return  # no lock file (or not ours to open): nobody to ask
    with os.fdopen(fd, "r+") as f:
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EAGAIN):
                raise CheckpointDirBusy(busy_message(Path(root), _who(f))) from None
            raise
