"""Files only the user may read: folders 0700, files 0600, written whole or not at all.

A checkpoint, a client's personal state, a strategy's private model or the tracking store may
hold what a method keeps from other parties (a server-private model, a client's data-derived
state). They are created private whatever the umask, and replaced by a rename of a fully written,
fsynced file, so a crash or a full disk leaves the previous version in place.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

#: Permissions of raysim's private files and folders.
FILE_MODE, DIR_MODE = 0o600, 0o700


def private_dir(path: str | os.PathLike, *, parents: bool = True) -> Path:
    """Create ``path`` (and missing parents) readable by the user only; an existing folder keeps
    its permissions (the user chose them)."""
    d = Path(path)
    if not d.is_dir():
        if parents and not d.parent.is_dir():
            private_dir(d.parent)
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)
        os.chmod(d, DIR_MODE)  # mkdir's mode is masked by the umask
    return d


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in ``path`` durable (no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - a filesystem without folder fsync
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def private_temp(
    folder: str | os.PathLike, prefix: str = ".tmp-"
) -> Iterator[tuple[IO[bytes], Path]]:
    """A new 0600 file with a unique name in ``folder``, open for writing; removed unless the
    caller has renamed it away when the block ends."""
    fd, name = tempfile.mkstemp(prefix=prefix, dir=folder)  # mkstemp: 0600, O_EXCL
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f, path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def write_private(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> Path:
    """Write ``data`` to ``path`` atomically (a unique temp file, fsync, rename, folder fsync),
    0600. On any error ``path`` is left as it was and the temp file is removed."""
    target = Path(path)
    private_dir(target.parent)
    with private_temp(target.parent, prefix=f".{target.name}.") as (f, tmp):
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        os.replace(tmp, target)
    fsync_dir(target.parent)
    return target


def make_private(path: str | os.PathLike) -> None:
    """Restrict an existing file (0600) or folder (0700) to the user."""
    p = Path(path)
    os.chmod(p, DIR_MODE if p.is_dir() else FILE_MODE)


def new_private_file(path: str | os.PathLike) -> Path:
    """Create ``path`` empty and 0600 whatever the umask (``FileExistsError`` if it exists): a
    file another program then fills keeps that mode (sqlite, ``open(path, "wb")``)."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, FILE_MODE)  # os.open's mode is masked by the umask
    finally:
        os.close(fd)
    return Path(path)
