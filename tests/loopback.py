"""A real multi-process Ray cluster on this machine: ``ray start --head`` and ``ray start
--address`` as child processes, with token authentication on. The cluster is stopped by signalling
the two ``ray start --block`` process groups this helper started, never by ``ray stop`` (which
would stop every Ray on the machine)."""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


#: Ports no process on this machine is handed without asking for them by number: below Linux's
#: ephemeral range (32768-60999, where every ``bind(port=0)`` lands, Ray's own included) and above
#: Ray's worker ports (10002-19999). A port handed out here cannot be taken by a Ray process in the
#: seconds before its server binds it (CI once saw the MLflow server's port answer in gRPC).
_RESERVED = range(20000, 32768)
_handed: set[int] = set()


def free_port() -> int:
    """A port that binds now, outside the ranges Ray and the kernel pick from, and not handed out
    before by this process."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.choice(_RESERVED)
        if port in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.add(port)
        return port
    raise RuntimeError(f"no free port in {_RESERVED.start}-{_RESERVED.stop - 1}")


@dataclass
class Loopback:
    gcs: str  #: host:port for ``--address`` / ``ray.init``
    dashboard: str  #: http://host:port, where ``ray job submit`` talks
    env: dict[str, str]  #: what a client process needs: the token, and no stray address
    temp_dir: Path

    def run(self, *args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout, **kw
        )


def _wait_ready(proc: subprocess.Popen, log: Path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise RuntimeError(f"ray start did not come up:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM both ``ray start --block`` groups at once (each stops its own Ray processes),
    then SIGKILL what is left of those groups."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def can_hide_folders() -> bool:
    """Whether a process here may mount over a folder in a mount namespace of its own
    (``unshare --mount``: root, or a user namespace, with the ``unshare`` tool)."""
    probe = (
        subprocess.run(
            ["unshare", "--mount", "sh", "-c", "mount -t tmpfs none /mnt"],
            capture_output=True,
            check=False,
        )
        if shutil.which("unshare")
        else None
    )
    return probe is not None and probe.returncode == 0


@contextmanager
def loopback_cluster(
    head_cpus: int = 2,
    worker_cpus: int = 2,
    worker_gpus: int = 1,
    node_local: Path | None = None,
) -> Iterator[Loopback]:
    """A head with ``head_cpus`` and no GPU, and a worker node with ``worker_gpus`` logical GPUs.
    ``node_local``: a folder the worker node does not share with the head: its processes see an
    empty folder of their own there (a tmpfs in a mount namespace: ``can_hide_folders``), as a
    node of a real cluster sees its own local disk."""
    temp = Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))  # Ray's socket paths must stay short
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    gcs_port, dash_port = free_port(), free_port()
    common = ["--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]

    def own_ports() -> list[str]:
        """Each node's agents on ports of their own: Ray's fixed defaults (52365 for the
        dashboard agent, say) may be held by another Ray on this machine."""
        flags = (
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
            "ray-client-server-port",
        )
        return [f"--{flag}={free_port()}" for flag in flags]

    procs: list[subprocess.Popen] = []
    try:
        head_log = temp / "head.log"
        procs.append(
            subprocess.Popen(
                [RAY, "start", "--head", *common, *own_ports(), f"--port={gcs_port}",
                 f"--num-cpus={head_cpus}", "--num-gpus=0", "--dashboard-host=127.0.0.1",
                 f"--dashboard-port={dash_port}",
                 "--include-dashboard=true", f"--temp-dir={temp}"],
                env=env, stdout=head_log.open("w"), stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )  # fmt: skip
        _wait_ready(procs[0], head_log, "Ray runtime started", 120)
        node_log = temp / "node.log"
        node = [RAY, "start", *common, *own_ports(), f"--address=127.0.0.1:{gcs_port}",
                f"--num-cpus={worker_cpus}", f"--num-gpus={worker_gpus}",
                # a temp dir of its own, as a real node has: on a shared one both nodes' runtime
                # env agents unpack a job's working dir into the same folder, and Ray's agent
                # deletes and unpacks it again for the node's first task, under the running
                # driver (a lazy import then failed: ModuleNotFoundError in CI)
                f"--temp-dir={temp / 'node'}"]  # fmt: skip
        if node_local is not None:
            node_local.mkdir(parents=True, exist_ok=True)
            hide = f'mount -t tmpfs none "{node_local}" && exec "$@"'
            node = ["unshare", "--mount", "sh", "-c", hide, "sh", *node]
        procs.append(
            subprocess.Popen(
                node,
                env=env, stdout=node_log.open("w"), stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )  # fmt: skip
        _wait_ready(procs[1], node_log, "Ray runtime started", 120)
        yield Loopback(f"127.0.0.1:{gcs_port}", f"http://127.0.0.1:{dash_port}", env, temp)
    finally:
        _stop(procs)
