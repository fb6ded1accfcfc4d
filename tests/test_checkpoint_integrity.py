"""Checkpoints that survive (issue 56, item 3): a disk that fills during a checkpoint leaves the
previous one resumable to the same weights; two runs on one checkpoint.dir are refused in one
line; the folder keeps nothing but its checkpoints (a user's file beside them is left alone)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from raysim.config import load_config
from raysim.state import checkpoint, checkpoint_files
from raysim.state.checkpoint_files import CheckpointDirBusy
from tests.conftest import ROOT, tiny


def _cfg(folder: Path, rounds: int = 4, **more) -> dict:
    return tiny(
        rounds=rounds,
        runtime="local",
        workers={"count": 1},
        tracking={"enabled": False},
        checkpoint={"every": 1, "dir": str(folder)},
        **more,
    )


def _mount_cmd() -> list[str] | None:
    """How to run a command with a tmpfs mounted of its own: as root, ``unshare --mount``;
    otherwise in a user namespace (``--map-root-user``); None where neither is allowed."""
    if shutil.which("unshare") is None:
        return None
    for cmd in (["unshare", "--mount"], ["unshare", "--user", "--map-root-user", "--mount"]):
        probe = subprocess.run([*cmd, "sh", "-c", "mount -t tmpfs -o size=1m none /mnt"],
                               capture_output=True)  # fmt: skip
        if probe.returncode == 0:
            return cmd
    return None


#: In a mount namespace of its own: a 4 MiB tmpfs at argv[1] holds checkpoint.dir. After the
#: first checkpoint, a filler leaves half a checkpoint free, so the next one runs out midway.
FULL_DISK = textwrap.dedent(
    """
    import json, os, sys, warnings
    from pathlib import Path
    import raysim
    from raysim.state import checkpoint_files
    from raysim.config import load_config

    import logging
    folder, cfg = Path(sys.argv[1]), json.loads(sys.argv[2])
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logging.getLogger("raysim").addHandler(handler)
    session = raysim.RunSession(load_config(cfg))
    session.step()  # round 0; its checkpoint (next round 1) is written
    first = checkpoint_files.current(folder)
    size = sum(p.stat().st_size for p in first.iterdir())
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    with open(folder.parent / "filler", "wb") as f:
        f.write(b"x" * max(0, free - size // 2))
    session.step()  # round 1: its checkpoint runs out of space
    session.step()  # the run goes on
    warned = [w for w in seen if "not written" in w]
    session.close()
    left = sorted(p.name for p in folder.iterdir())
    os.remove(folder.parent / "filler")
    print("FACTS " + json.dumps({"first": first.name, "left": left, "warned": warned,
                                 "current": checkpoint_files.current(folder).name}))
    """
)


def test_a_disk_filled_during_a_checkpoint_leaves_the_previous_one_resumable(tmp_path) -> None:
    mount = _mount_cmd()
    if mount is None:
        pytest.skip("this machine lets no process mount a tmpfs (no root, no user namespaces)")
    disk = tmp_path / "disk"
    disk.mkdir()
    folder = disk / "ckpt"
    cfg = _cfg(folder)
    script = (
        f'mount -t tmpfs -o size=4m none "{disk}" && '
        f'{sys.executable} -c "$0" "{folder}" "$1" && cp -a "{folder}" "{tmp_path}/saved"'
    )
    done = subprocess.run(
        [*mount, "sh", "-c", script, FULL_DISK, json.dumps(cfg)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.split("FACTS ", 1)[1].splitlines()[0])
    assert facts["warned"], "the failed checkpoint was not reported"
    assert "No space left" in facts["warned"][0] or "ENOSPC" in facts["warned"][0]
    assert facts["current"] == facts["first"]  # the previous checkpoint is still the current one
    assert facts["left"] == sorted([".raysim.lock", "LATEST", facts["first"]])  # no temp left

    saved = tmp_path / "saved"
    resumed = checkpoint.prepare_resume(saved)
    assert resumed.round == 1
    import raysim

    whole = raysim.run(_cfg(tmp_path / "whole"))
    again = raysim.run(resume=saved)
    assert again.weights_digest == whole.weights_digest


def test_two_runs_on_one_checkpoint_dir_are_refused_in_one_line(tmp_path) -> None:
    """A second process that writes to the folder a live run holds is refused before it starts
    (the CLI, in one line), and so is its writer; once the first run ends, the folder is free."""
    folder = tmp_path / "shared"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from raysim import checkpoint_files as c; "
         "c.acquire(sys.argv[1]); print('held', flush=True); time.sleep(60)", str(folder)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        config = tmp_path / "run.yaml"
        config.write_text(json.dumps(_cfg(folder)))
        cli = subprocess.run(
            [sys.executable, "-m", "raysim.cli", "run", str(config)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert cli.returncode != 0
        lines = [ln for ln in cli.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and "in use by another run" in lines[0], cli.stderr
        assert f"pid {holder.pid}" in lines[0]
        with pytest.raises(CheckpointDirBusy, match="give each run its own checkpoint.dir"):
            checkpoint.Checkpointer(load_config(_cfg(folder)))
    finally:
        holder.kill()
        holder.wait()
    writer = checkpoint.Checkpointer(load_config(_cfg(folder)))  # the holder is gone: free
    writer.close()


def test_the_folder_holds_only_its_checkpoints(tmp_path) -> None:
    """``checkpoint.dir=.``: a user's config.yaml there is left alone; only the current
    checkpoint is kept; every file is 0600 and every folder 0700 whatever the umask."""
    (tmp_path / "config.yaml").write_text("mine: true\n")
    old = os.umask(0o022)
    try:
        cfg = load_config(_cfg(tmp_path))
        writer = checkpoint.Checkpointer(cfg)
        for r in (1, 2, 3):
            writer.save({"x": np.arange(3.0) + r, "t": (r, "a"), "k": {1: 2}}, r)
        writer.close()
    finally:
        os.umask(old)
    assert (tmp_path / "config.yaml").read_text() == "mine: true\n"
    current = checkpoint_files.current(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["config.yaml", "LATEST", ".raysim.lock", current.name]
    )
    for p in current.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600, p
    assert current.stat().st_mode & 0o777 == 0o700
    _, state = checkpoint.unpack(checkpoint.read_dir(tmp_path))
    np.testing.assert_array_equal(state["x"], np.arange(3.0) + 3)
    assert state["t"] == (3, "a") and state["k"] == {1: 2}


def test_a_pickled_checkpoint_is_refused_and_never_unpickled(tmp_path) -> None:
    """A format-2 checkpoint (a pickle) is refused with the reason; the pickle is not loaded
    even when its hashes match (it would run the code it names)."""
    import hashlib
    import pickle

    class Boom:
        def __reduce__(self):
            return (Path(tmp_path / "ran").write_text, ("pickle ran",))

    blob = pickle.dumps(Boom())
    cfg = load_config(_cfg(tmp_path / "unused"))
    files = {"state.pkl": blob, "config.yaml": b"{}"}
    meta = {"format": 2, "round": 1, "run_id": None, "config_hash": checkpoint.config_hash(cfg),
            "files": {n: hashlib.sha256(b).hexdigest() for n, b in files.items()}}  # fmt: skip
    folder = tmp_path / "old"
    folder.mkdir()
    for name, data in {**files, "meta.json": json.dumps(meta).encode()}.items():
        (folder / name).write_bytes(data)
    with pytest.raises(checkpoint.ResumeError, match="pickle"):
        checkpoint.unpack(checkpoint.read_dir(folder))
    with pytest.raises(checkpoint.ResumeError, match="never loads"):
        checkpoint.prepare_resume(folder)
    assert not (tmp_path / "ran").exists()


class _FlakyTracker:
    """A tracking store that answers "database is locked" ``fails`` times, then works."""

    run_id = "r"

    def __init__(self, fails: int) -> None:
        self.fails, self.logged, self.warned = fails, [], []

    def flush(self) -> None:
        pass

    def log_checkpoint(self, files, name, next_round) -> None:
        if self.fails:
            self.fails -= 1
            import sqlite3

            raise sqlite3.OperationalError("database is locked")
        self.logged.append((sorted(Path(f).name for f in files), name, next_round))

    def warn(self, message: str) -> None:
        self.warned.append(message)


def test_tracking_errors_around_a_checkpoint_are_retried_then_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "TRACKING_PAUSE_S", 0.0)
    state = {"x": np.arange(3.0)}
    cfg = load_config({**_cfg(tmp_path / "d"), "tracking": {"enabled": True}})
    flaky = _FlakyTracker(fails=2)  # two tries fail, the third lands
    writer = checkpoint.Checkpointer(cfg, flaky)
    assert writer.save(state, 1) is True and flaky.logged and not flaky.warned
    assert flaky.logged[0][0] == ["arrays.safetensors", "config.yaml", "meta.json", "state.json"]

    broken = _FlakyTracker(fails=99)  # the folder has it, the store does not: reported
    writer.tracker = broken
    assert writer.save(state, 2) is False
    assert "not in the tracking store" in broken.warned[0] and "locked" in broken.warned[0]
    meta, _ = checkpoint.unpack(checkpoint.read_dir(tmp_path / "d"))
    assert meta["round"] == 2  # the folder's copy is the newer one
    writer.close()

    nodir = load_config({**_cfg(tmp_path / "e"), "tracking": {"enabled": True},
                         "checkpoint": {"every": 1}})  # fmt: skip
    with pytest.raises(checkpoint.CheckpointNotWritten, match="database is locked"):
        checkpoint.Checkpointer(nodir, _FlakyTracker(fails=99)).save(state, 1)


def test_a_checkpoint_only_in_the_folder_keeps_the_states_both_refer_to() -> None:
    """Written to checkpoint.dir but not to the tracking store: the personal-state files of
    the store's older checkpoint stay, besides the new one's."""
    from raysim.actors.coordinator_core import CoordinatorCore

    core = object.__new__(CoordinatorCore)
    old, new = {"a"}, {"b"}
    collected = []
    core._checkpointed = set(old)
    core.stored_states = lambda: set(new)
    core._collect = collected.append
    core.checkpoint_written(everywhere=False)
    assert core._checkpointed == {"a", "b"} and not collected
    core.checkpoint_written()
    assert core._checkpointed == {"b"} and collected == ["a"]
