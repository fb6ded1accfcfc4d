"""``raysim`` command line (``raysim COMMAND --help`` for each command's options).

``main`` parses the arguments and runs the command's ``cmd_*`` function: ``run``, ``loto`` and
``lodo`` (``leave_one_out``), ``ui``, ``tune``, ``methods``, ``pretrain`` and ``foundation``,
``extract``, each in the module of that name; ``parser`` builds the arguments, ``common`` holds
what they share. Each command imports torch, Ray or MLflow only once it runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import NoReturn

from raysim.cli.common import error, errors, user_errors
from raysim.cli.parser import build_parser

__all__ = ["build_parser", "entry", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # before the imports below: --help answers at once
    args.argv = list(sys.argv[1:] if argv is None else argv)  # to say how to start again
    from raysim.errors import Diverged, LeakError, PrivacyError, RunSetupError
    from raysim.launch.session import CoordinatorLost
    from raysim.state.store import StateStoreError
    from raysim.util.quiet import quiet_libraries

    quiet_libraries()
    try:
        return int(args.func(args))
    except user_errors() as e:
        return error(str(e))
    except CoordinatorLost as e:  # the run is marked FAILED; the message says where it stopped
        errors.print(f"raysim: error: {e}", style="red", markup=False)
        return 1
    except (LeakError, RunSetupError, Diverged, StateStoreError, PrivacyError) as e:  # Ray wraps
        cause = getattr(e, "cause", None) or e
        errors.print(f"raysim: error: {cause}", style="red", markup=False)
        return 1


def entry() -> NoReturn:
    """The ``raysim`` command: ``main``, then a quick exit. Once the command is done (its threads
    joined and its atexit handlers run, as at any exit, and its output flushed), the process ends
    without Python tearing torch, Ray and MLflow down module by module: 0.6 s of a quickstart
    run, 1.5 s where MLflow is loaded (benchmarks/RESULTS.md). ``main`` itself returns, for
    callers in a Python process."""
    import atexit
    import faulthandler

    # a crash in native code prints the Python stack (the driver runs without Ray's C++ crash
    # handler: raysim.launch.private_ray._driver_without_crash_handler)
    faulthandler.enable()
    code = main()
    threading._shutdown()  # what interpreter exit does first: non-daemon threads, pools' hooks
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
