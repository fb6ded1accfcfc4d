"""The run's MLflow writer in a process of its own, for a run without Ray
(``raysim.launch.without_ray``).

Importing MLflow and opening its store cost about 2 s of CPU on 2 vCPUs, and inside the run's
process they take the GIL from its own start (torch's import walks ``sys.modules``, which MLflow's
import fills meanwhile: 2.9 s → 6.8 s for the whole quickstart). A run whose coordinator is an
actor has a process for them already; a run without Ray gets this one instead. It is started
first, so MLflow loads on another core while the run builds its model, and the run's thread only
pickles calls onto a pipe.

``TrackerProcess`` has the ``Tracker`` methods the coordinator uses. Calls whose result nobody
needs (a round's metrics, a tag, an artifact) are sent and not waited for; the child runs them in
order, so a checkpoint or the run's end still finds every round before it in the store. Those the
run waits on (a checkpoint, the run's end, ``flush``) return once the child has written
everything before them, and raise the first error any earlier call met. The child ignores
SIGINT and SIGTERM (a group's signal reaches it too): the run, stopping, marks itself KILLED
through it; it exits when its pipe closes, so it never outlives the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

log = logging.getLogger("raysim")


class TrackerProcessError(RuntimeError):
    """The tracking process failed, or ended before it answered."""


class TrackerProcess:
    """A ``Tracker`` in a child process (see the module's docstring)."""

    def __init__(self, uri: str) -> None:
        """Start the child now: it imports MLflow and opens the store at ``uri`` while the run
        builds; ``open`` then makes the run's MLflow run."""
        up_r, up_w = os.pipe()  # child → parent
        down_r, down_w = os.pipe()  # parent → child
        home = str(Path(__file__).resolve().parents[1])  # this raysim, whatever sys.path says
        path = os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "raysim.tracking.process", str(down_r), str(up_w), uri],
            pass_fds=(down_r, up_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path},
        )
        os.close(down_r)
        os.close(up_w)
        self._to = Connection(down_w, readable=False)
        self._from = Connection(up_r, writable=False)
        self._lock = threading.Lock()  # one call on the pipe at a time (``stop``'s thread too)
        self._sent = 0  # calls sent; a waited call reads answers up to its own number
        self.uri = uri
        self.run_id: str | None = None
        self.warnings: list[str] = []
        self.ended = False
        self.logged_through = -1
        self._batching = False
        self._unsent: list[tuple[int, dict[str, float], bool]] = []

    def open(self, **tracker_args: Any) -> TrackerProcess:
        """Make (or reopen, ``resume_run_id``) the MLflow run: ``Tracker``'s arguments."""
        self.run_id, self.logged_through = self._call("__open__", (), tracker_args)
        return self

    # ------------------------------------------------------------------ the pipe
    def _call(self, method: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Run ``method`` in the child and wait for it (and for every call before it, the
        rounds that wait included)."""
        self._send_rounds()
        with self._lock:
            self._sent += 1
            mine = self._sent
            try:
                self._to.send((mine, method, args, kwargs or {}, True))
                answer = -1
                while answer != mine:  # one left by a call that an interrupt cut short
                    answer, ok, value = self._from.recv()
            except (EOFError, OSError) as e:
                raise TrackerProcessError(
                    f"the MLflow writer's process ended (exit code {self._proc.poll()})"
                ) from e
        if not ok:
            raise value
        return value

    def _post(self, method: str, args: tuple = (), kwargs: dict | None = None) -> None:
        """Queue ``method`` in the child without waiting (after the rounds that wait); an error
        comes back at the next waited call."""
        if method != "__rounds__":
            self._send_rounds()
        with self._lock:
            self._sent += 1
            try:
                self._to.send((self._sent, method, args, kwargs or {}, False))
            except OSError as e:
                raise TrackerProcessError("the MLflow writer's process ended") from e

    # ------------------------------------------------------------------ Tracker's methods
    def log_round(self, step: int, metrics: dict[str, float], final: bool = False) -> None:
        if (step <= self.logged_through and not final) or self.ended:
            return
        self._unsent.append((step, dict(metrics), final))
        if not self._batching:
            self._send_rounds()

    def _send_rounds(self) -> None:
        rounds, self._unsent = self._unsent, []
        if rounds:
            self._post("__rounds__", (rounds,))

    @contextlib.contextmanager
    def rounds_batched(self) -> Iterator[None]:
        """Rounds logged inside go to the child together, as the block ends."""
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
            self._send_rounds()

    def flush(self) -> None:
        """Return once every round and call before is in the store."""
        self._call("flush")

    def warn(self, message: str) -> None:
        log.warning(message)
        self.warnings.append(message)

    def set_tag(self, key: str, value: str) -> None:
        self._post("set_tag", (key, value))

    def log_dict(self, obj: Any, name: str) -> None:
        self._post("log_dict", (obj, name))

    def log_config(self, config: Any) -> None:
        self._post("log_config", (config,))

    def log_placement(self, coordinator_node: str, workers: Any) -> None:
        self._post("log_placement", (coordinator_node, workers))

    def log_private(self, secrets: Any) -> None:
        self._call("log_private", (secrets,))

    def log_checkpoint(self, files: Any, name: str, next_round: int) -> None:
        self._call("log_checkpoint", (files, name, next_round))

    def log_final(
        self,
        config: Any,
        weights: Any,
        client_rows: Iterable[Mapping[str, Any]],
        *args: Any,
        client_columns: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """``Tracker.log_final``; the per-client table is written here first, row by row (it
        may hold a million rows), and the child copies the file."""
        from raysim.tracking.artifacts import write_clients_csv

        fd, csv = tempfile.mkstemp(prefix="raysim-clients-", suffix=".csv")
        os.close(fd)
        try:
            write_clients_csv(Path(csv), client_rows, client_columns)
            kwargs["clients_csv"] = csv
            self._call("__final__", (list(self.warnings), (config, weights, (), *args), kwargs))
        finally:
            os.unlink(csv)
        self.ended = True

    def fail(self, status: str = "FAILED") -> None:
        self.ended = True
        self._call("fail", (status,))

    def close(self) -> None:
        """End the child (after the calls it has); it exits as its pipe closes."""
        with self._lock:
            for end in (self._to, self._from):
                with contextlib.suppress(OSError):
                    end.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def _serve(down: Connection, up: Connection, uri: str) -> None:
    """The child's loop: calls from the run, in order, until its pipe closes."""
    from raysim.tracking.store import open_store
    from raysim.tracking.tracker import Tracker

    try:
        open_store(uri)  # ahead of the run's first call: import, schema, migration
    except Exception:  # noqa: BLE001, S110 - raised again, in one line, where the run opens it
        pass
    tracker: Tracker | None = None
    error: BaseException | None = None  # the first error of a call nobody waited for
    while True:
        try:
            number, method, args, kwargs, wait = down.recv()
        except (EOFError, OSError):
            break
        try:
            if error is not None:
                raise error
            if method == "__open__":
                tracker = Tracker(uri, **kwargs)
                value: Any = (tracker.run_id, tracker.logged_through)
            elif method == "__rounds__":
                with tracker.rounds_batched():  # one request, written behind
                    for step, metrics, final in args[0]:
                        tracker.log_round(step, metrics, final)
                value = None
            elif method == "__final__":
                tracker.warnings = args[0]
                value = tracker.log_final(*args[1], **args[2])
            else:
                value = getattr(tracker, method)(*args, **kwargs)
            if wait:
                up.send((number, True, value))
        except BaseException as e:  # noqa: BLE001 - the run's next waited call raises it
            error = None
            if wait:
                _send_error(up, number, e)
            else:
                error = e
    if tracker is not None:
        with contextlib.suppress(Exception):
            tracker.close()


def _send_error(up: Connection, number: int, error: BaseException) -> None:
    try:
        up.send((number, False, error))
    except Exception:  # noqa: BLE001 - an error that does not pickle goes as its line
        up.send((number, False, TrackerProcessError(f"{type(error).__name__}: {error}")))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run stops, then closes the pipe
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    down_fd, up_fd, uri = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    _serve(Connection(down_fd, writable=False), Connection(up_fd, readable=False), uri)
    # everything asked is written (sqlite commits each request): no interpreter teardown,
    # which with MLflow loaded takes ~1 s that the run's process would wait for
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
