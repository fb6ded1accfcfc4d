"""What every ``raysim`` command shares: the consoles, the exit codes, SIGTERM's handling and the
one-line report of a user's mistake."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console

console = Console()
#: when the command began (its imports aside): the summary's "command" time counts from here
STARTED = time.perf_counter()
#: errors and stop notices: stderr, never wrapped, never parsed as markup
errors = Console(stderr=True, soft_wrap=True, highlight=False, markup=False)

#: exit codes: a user's mistake, and stops by signal (128 + SIGINT / SIGTERM)
EXIT_USAGE, EXIT_SIGINT, EXIT_SIGTERM = 2, 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so the run ends like Ctrl-C (marked KILLED)."""


@contextlib.contextmanager
def on_sigterm(handler: Any) -> Iterator[None]:
    """``handler`` takes SIGTERM (``kill PID``) while the block runs, in the main thread only;
    the previous handler comes back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def error(message: str) -> int:
    """One line on stderr for a mistake the user can fix; the exit code for it."""
    errors.print(f"raysim: error: {message}", style="red", markup=False)
    return EXIT_USAGE


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's input, not a bug: reported in one line, exit 2."""
    from raysim.algorithms.registry import PluginError
    from raysim.config import ConfigError
    from raysim.launch.inputs import MissingInput
    from raysim.launch.private_ray import ClusterError
    from raysim.launch.resources import ResourceError
    from raysim.util.kernels import KernelsError

    return (ConfigError, PluginError, ResourceError, ClusterError, MissingInput, KernelsError)
