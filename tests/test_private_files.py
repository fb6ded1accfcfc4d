"""Files that may hold private data are the user's alone whatever the umask: personal client
states, the MLflow store raysim makes, FedBaF's server-private artifact, the ui's log and
DeepSpeed's build folder (0600 files, 0700 folders). No Ray."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest


def mode(path: str | os.PathLike) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(autouse=True)
def umask_022():
    """The usual umask, under which a plain write is world-readable (0644, folders 0755)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_a_disk_store_is_private(tmp_path):
    from raysim.state.store import MARKER, open_store, run_folder
    from raysim.util.private_files import new_private_file

    parent = tmp_path / "states"  # clients.state.dir, made by the store
    root = run_folder(str(parent))
    token = open_store(root).save(1234, 7, {"w": np.ones(3, np.float32)})
    file = Path(root) / token.name
    assert file.is_file() and mode(file) == 0o600
    assert mode(Path(root) / MARKER) == 0o600
    assert [mode(d) for d in (file.parent, root, parent)] == [0o700] * 3
    assert not [p for p in file.parent.iterdir() if p != file]  # no temp file left
    made = new_private_file(tmp_path / "x")
    assert mode(made) == 0o600 and made.read_bytes() == b""
    with pytest.raises(FileExistsError):
        new_private_file(made)


def test_the_tracking_store_raysim_makes_is_private(tmp_path, monkeypatch):
    from raysim.tracking.store import default_tracking_uri, open_store
    from raysim.tracking.tracker import Tracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # the artifacts' default root: ./mlruns
    uri = default_tracking_uri(tmp_path)
    open_store(uri)
    assert mode(tmp_path / "mlflow.db") == 0o600
    assert not list(tmp_path.glob(".mlflow.db*"))  # the side file became the store

    users = tmp_path / "users"  # an empty store the user made keeps the user's mode
    users.mkdir()
    (users / "mlflow.db").touch(mode=0o640)
    open_store(default_tracking_uri(users))
    assert mode(users / "mlflow.db") == 0o640 and (users / "mlflow.db").stat().st_size > 0

    from raysim.algorithms.base import Secret

    tracker = Tracker(uri, "private", "r", {}, {})
    tracker.log_private([Secret("w", np.arange(2), np.ones(2, np.float32))])
    staged = tmp_path / "staged"
    staged.mkdir()
    for name, data in {"state.json": b"{}", "meta.json": b"{}"}.items():
        (staged / name).write_bytes(data)  # 0644 under this umask
    files = [str(staged / "state.json"), str(staged / "meta.json")]
    tracker.log_checkpoint(files, "round-000001-0123abcd", 1)
    arts = Path(tracker.client.get_run(tracker.run_id).info.artifact_uri.removeprefix("file://"))
    folder = arts / "checkpoint" / "round-000001-0123abcd"
    logged = [arts / "private" / "foundation.safetensors", *folder.iterdir()]
    assert len(logged) == 3 and [mode(p) for p in logged] == [0o600] * 3
    tracker.close()


def test_the_ui_log_is_a_new_private_file_it_names():
    from raysim.cli.ui import ui_log

    logs = [ui_log(5000), ui_log(5000)]
    try:
        assert logs[0] != logs[1] and all(p.name.startswith("raysim-ui-5000-") for p in logs)
        assert [mode(p) for p in logs] == [0o600] * 2
    finally:
        for p in logs:
            p.unlink()


def test_deepspeeds_build_folder_is_private_and_only_made_when_needed(monkeypatch, tmp_path):
    from raysim.training import backends

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    with backends._deepspeed_env():
        first = os.environ["TORCH_EXTENSIONS_DIR"]
    with backends._deepspeed_env():
        again = os.environ["TORCH_EXTENSIONS_DIR"]
    assert "TORCH_EXTENSIONS_DIR" not in os.environ  # only while DeepSpeed runs
    assert first == again and Path(first).name.startswith("raysim-ds-")
    assert mode(first) == 0o700 and Path(first).parent == Path(backends.tempfile.gettempdir())
    mine = tmp_path / "ext"  # the user's own: used as it is, nothing made
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(mine))
    monkeypatch.setattr(backends, "_DS_EXTENSIONS", None)
    with backends._deepspeed_env():
        assert os.environ["TORCH_EXTENSIONS_DIR"] == str(mine)
    assert backends._DS_EXTENSIONS is None and not mine.exists()
