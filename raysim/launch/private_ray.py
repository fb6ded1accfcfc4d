"""Where a run's Ray lives and how it starts: a private local instance by default.

Kept free of torch and of raysim's config, so that reaching Ray costs only Ray's import.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any


class ClusterError(RuntimeError):
    """The named Ray cluster cannot be reached."""


def ray_address(address: str | None) -> str:
    """Where a run's Ray lives: the cluster the user named (``--address``, else
    ``$RAY_ADDRESS``), otherwise a private local instance: never the cluster that the machine's
    last ``ray start`` left in Ray's current-cluster file, which may be stale or someone else's."""
    return address or os.environ.get("RAY_ADDRESS") or "local"


def check_reachable(address: str, timeout_s: float = 5.0, named_by: str = "--address") -> None:
    """Fail in seconds, with one line, if a named cluster does not answer (instead of Ray's
    minutes-long retries). ``auto`` is resolved the way Ray resolves it. ``named_by``: where the
    address came from (``--address`` or ``RAY_ADDRESS``), as the error says."""
    import socket

    leave_out = "leave --address out" if named_by == "--address" else f"unset {named_by}"

    if address == "local" or "://" in address:
        return  # a private instance; or Ray Client, which reports its own errors
    where = address
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            where = get_ray_address_from_environment("auto", None)
        except ConnectionError:  # Ray 2.60 raises where older versions returned None
            where = None
        if not where:
            raise ClusterError(
                f"{named_by} auto: no Ray cluster was started on this machine (ray start "
                f"--head); {leave_out} to run on a private local Ray"
            )
    host, _, port = where.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except (OSError, ValueError):
        raise ClusterError(
            f"no Ray cluster answers at {where}"
            + (" (the last one `ray start` recorded on this machine)" if address == "auto" else "")
            + f"; start it, name another with --address, or {leave_out} to run on a private "
            "local Ray"
        ) from None


def ensure_ray(
    address: str | None = None,
    *,
    target: str | None = None,
    resources: Mapping[str, float] | None = None,
    **init_kwargs: Any,
) -> bool:
    """Start a private local Ray, or connect to the named cluster, unless Ray is already up in
    this process; True if this call started it. ``target``: the address a plan resolved
    (``RunPlan.target``), else resolved here from ``address`` (``ray_address``). A private Ray
    gets ``resources`` (the plan's; counted here where not given) as its CPUs and GPUs, so
    that Ray's count is raysim's: container quotas honoured, GPUs counted where Ray's own
    detection gives 0 on an NVML error."""
    import signal

    import ray

    if ray.is_initialized():
        return False
    target = ray_address(address) if target is None else target
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": "WARNING"}
    if target == "local":  # a named cluster keeps the user's own auth settings and counts
        private_ray_auth()
        if resources is None:
            from raysim.launch.resources import local_resources

            resources = local_resources()
        kwargs["num_cpus"] = int(resources.get("CPU", 1))
        kwargs["num_gpus"] = int(resources.get("GPU", 0))
    kwargs.update(init_kwargs)
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        with private_ray_params(target == "local"):
            ray.init(address=target, **kwargs)
    except SystemExit as stop:
        # ray.init installs a handler that exits with code 15; a caller with its own handler
        # (the CLI ends the run as KILLED and exits 143) gets the SIGTERM as it would have
        if stop.code != signal.SIGTERM or not callable(sigterm):
            raise
        ray.shutdown()
        sigterm(signal.SIGTERM, None)
        raise
    finally:
        if callable(sigterm):
            signal.signal(signal.SIGTERM, sigterm)  # ray.init replaces it; keep the caller's
    return True


#: Where a private Ray's processes listen: loopback only (``ray.init`` would turn 127.0.0.1
#: into the machine's LAN address, and Ray binds its servers to the node's address).
LOOPBACK = "127.0.0.1"
_TOKEN: list[str] = []  # this process's private-Ray token, made once


def private_ray_auth() -> str:
    """Token authentication for a private Ray: ``RAY_AUTH_MODE=token`` and a random token of this
    process (``RAY_AUTH_TOKEN``, in the environment only, never on disk), unless the user set
    ``RAY_AUTH_MODE`` or a token already. Ray's processes inherit both, so only processes this
    driver starts can call them. Returns the mode in force; ``disabled`` (the user's choice)
    is warned about once."""
    import secrets
    import warnings

    mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower()
    if mode == "disabled":
        if not _TOKEN:
            _TOKEN.append("")
            warnings.warn(
                "RAY_AUTH_MODE=disabled: the run's private Ray accepts any process on this "
                "machine (its listeners stay on loopback); unset it for token authentication",
                stacklevel=3,
            )
        return mode
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        if not _TOKEN or not _TOKEN[0]:
            _TOKEN[:] = [secrets.token_hex(32)]
        os.environ["RAY_AUTH_TOKEN"] = _TOKEN[0]
    if mode != "token":
        os.environ["RAY_AUTH_MODE"] = "token"
        _refresh_ray_auth()
    return "token"


def _refresh_ray_auth() -> None:
    """Make an already imported Ray read the auth settings again (it caches them)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # pragma: no cover - another Ray layout
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


#: Ray settings a private Ray starts with (a user's own environment wins): the raylet's first
#: look for its own object store, made before the store listens in about one start of three on
#: 2 vCPUs, is retried after 0.1 s instead of 1 s, with 100 tries instead of 10 (the same 10 s
#: in all). Ray's processes inherit them; every Ray client connection follows the same rule.
PRIVATE_RAY_ENV = {
    "RAY_raylet_client_connect_timeout_milliseconds": "100",
    "RAY_raylet_client_num_connect_attempts": "100",
}

#: Ray settings of the driver's own Ray core, with any Ray (a user's own environment wins): a
#: signal (Ctrl-C, SIGTERM) reaches Python within 0.1 s of a blocking ``ray.get`` instead of
#: Ray's 1 s, the look between waits for the objects (a stop during start-up took up to 1 s
#: longer: the driver waits on the coordinator's set-up then). A private Ray's processes inherit
#: it; a named cluster's do not.
DRIVER_RAY_ENV = {"RAY_get_check_signal_interval_milliseconds": "100"}


@contextlib.contextmanager
def private_ray_params(local: bool) -> Iterator[None]:
    """Start-up settings for a private Ray that ``ray.init`` does not expose: the environment
    of ``PRIVATE_RAY_ENV``, three of Ray's node parameters, and its API server started beside the
    rest (``_api_server_beside``); with any Ray, the driver's ``DRIVER_RAY_ENV``:

    - the node's address is loopback (``LOOPBACK``): Ray binds its GCS, raylet, workers and
      agents to the node's address, which ``ray.init`` otherwise sets to the LAN address even
      when given 127.0.0.1 (they listened on all interfaces or the LAN: anyone on the network
      could reach them);
    - the dashboard agent's HTTP server takes any free port. ``ray.init`` binds it to 52365
      (ray-project/ray#14763); while a second Ray runs on the machine (a sweep, a test session,
      another run) the agent retries that port for ~3.5 s on the start's critical path, then runs
      without it. Port 0 is what ``ray.cluster_utils.Cluster`` gives each of its nodes;
    - no autoscaler monitor (``ray start --no-monitor``): a private Ray has a fixed size, and the
      monitor is a Python process that competes with the workers' start and takes 1 s to stop.

    Where Ray's internals differ from the pinned version's, Ray starts as it would have."""
    from unittest import mock

    try:
        from ray._private import node, parameter, services
    except ImportError:  # pragma: no cover - another Ray layout
        node = parameter = services = None
    base = getattr(parameter, "RayParams", None)
    start_api_server = getattr(getattr(node, "Node", None), "start_api_server", None)

    class PrivateRayParams(base or object):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["node_ip_address"] = LOOPBACK
            kwargs.setdefault("dashboard_agent_listen_port", 0)
            kwargs.setdefault("no_monitor", True)
            super().__init__(*args, **kwargs)

    starting: list[threading.Thread] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_driver_without_crash_handler())
        wanted = {**DRIVER_RAY_ENV, **(PRIVATE_RAY_ENV if local else {})}
        env = {k: v for k, v in wanted.items() if k not in os.environ}
        stack.enter_context(mock.patch.dict(os.environ, env))
        if local:
            if base is not None:
                stack.enter_context(mock.patch.object(parameter, "RayParams", PrivateRayParams))
            popen = _own_session_popen(services)
            if popen is not None:
                stack.enter_context(mock.patch.object(services, "ConsolePopen", popen))
            if start_api_server is not None:
                beside = _api_server_beside(start_api_server, starting)
                stack.enter_context(mock.patch.object(node.Node, "start_api_server", beside))
                stack.enter_context(_dashboard_check_once())
        yield
        for thread in starting:  # up by now: the raylet's start took longer (none if it failed)
            thread.join()


@contextlib.contextmanager
def _driver_without_crash_handler() -> Iterator[None]:
    """The driver's Ray core without Ray's C++ crash handler, which also takes SIGTERM: one that
    came while ``ray.init`` connected printed a C++ stack trace on the console, where it is the
    run's stop (the CLI's handler takes it once ``ray.init`` returns). Ray reads the switch
    (``RAY_DISABLE_FAILURE_SIGNAL_HANDLER``) once, at import; its own processes keep theirs."""
    from unittest import mock

    try:
        from ray._private import ray_constants
    except ImportError:  # pragma: no cover - another Ray layout
        yield
        return
    with mock.patch.object(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", True):
        yield


def _own_session_popen(services: Any) -> type | None:
    """Ray's ``ConsolePopen`` that starts each of a private Ray's processes (GCS, raylet and the
    workers the raylet forks, log monitor, API server) in a session of its own, or None where
    that cannot be done safely.

    ``timeout``, ``kill -TERM -PGID`` and a job scheduler signal a run's whole process group.
    Ray's processes, in the driver's group, then died at the same moment as the driver began to
    end the run: the driver's calls to them hung (36 s) and the run stayed RUNNING in MLflow.
    In their own session only the driver gets the signal, and it stops them as after Ctrl-C.
    They still end with the driver when it dies: Ray starts them with the kernel's fate-sharing
    (``PR_SET_PDEATHSIG``), which needs no shared group; where the kernel lacks it, Ray's
    reaper kills the driver's group instead, so they stay in it."""
    popen = getattr(services, "ConsolePopen", None)
    try:
        from ray._private.utils import detect_fate_sharing_support
    except ImportError:  # pragma: no cover - another Ray layout
        return None
    if popen is None or os.name != "posix" or not detect_fate_sharing_support():
        return None

    class OwnSessionPopen(popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    return OwnSessionPopen


@contextlib.contextmanager
def _dashboard_check_once() -> Iterator[None]:
    """Ray's check for the dashboard's packages (``ray[default]``), made once, before the API
    server's thread starts, and answered the same while it runs.

    Ray checks by importing ``ray.dashboard.optional_deps``, once in the API server's start and
    once in the raylet's. Run in two threads, the second import can find the first's
    half-imported module and take the packages for present where they are not (a Ray installed
    as ``ray[tune]``, as raysim's pyproject asks, or the GPU machine's bundle): it then starts
    the full dashboard agent, which fails, and the raylet with it."""
    from unittest import mock

    try:
        from ray._private import utils
    except ImportError:  # pragma: no cover - another Ray layout
        yield
        return
    check = getattr(utils, "get_dashboard_dependency_error", None)
    if check is None:  # pragma: no cover - another Ray layout
        yield
        return
    answer = check()
    with mock.patch.object(utils, "get_dashboard_dependency_error", lambda: answer):
        yield


def _api_server_beside(start: Any, starting: list[threading.Thread]) -> Any:
    """``Node.start_api_server`` that, without the dashboard (``include_dashboard=False``), starts
    Ray's API server in a thread instead of waiting for it before the raylet starts.

    Ray 2.60 starts that server (the dashboard's head process, here with its usage-stats module
    only) before the raylet and polls until it is up, about 0.6 s on 2 vCPUs, only to learn
    that it did not fail: its URL is then set to "" whatever it says. Started in a thread, it
    comes up while the raylet starts, and ``private_ray_params`` waits for the thread once
    ``ray.init`` returns, so Ray is then as it would have been."""

    def start_api_server(self: Any, *, include_dashboard: Any, raise_on_failure: bool) -> None:
        if include_dashboard is not False:
            start(self, include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)
            return
        self._webui_url = ""  # what Ray sets without the dashboard
        kwargs = {"include_dashboard": False, "raise_on_failure": raise_on_failure}
        thread = threading.Thread(
            target=start, args=(self,), kwargs=kwargs, name="raysim-ray-api-server", daemon=True
        )
        thread.start()
        starting.append(thread)

    return start_api_server
