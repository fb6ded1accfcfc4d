"""MLflow: the store (``store``), one run's writer (``tracker``) and the process it runs in
(``process``), a run's tables and plots (``artifacts``), and the timeline of what each process
did (``timeline``). The coordinator is the only writer."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: the names of the old module ``raysim.tracking`` and the module each moved to (removed in the
#: next release)
_MOVED = {
    "LOOPBACK": "store",
    "NODE_TAG": "store",
    "RESTRICTED_TAG": "store",
    "SESSION_TAG": "store",
    "STORE_HOME": "store",
    "Tracker": "tracker",
    "create_sqlite_schema": "store",
    "default_tracking_uri": "store",
    "ensure_experiment": "store",
    "node_local": "store",
    "open_store": "store",
    "plot_curves": "artifacts",
    "quiet_mlflow": "store",
    "relocate_store": "store",
    "rows_csv": "artifacts",
    "schema_template": "store",
    "store_lock": "store",
    "store_path": "store",
    "write_clients_csv": "artifacts",
    "write_rows_csv": "artifacts",
}


def __getattr__(name: str) -> Any:
    """An old ``raysim.tracking.NAME``, from the module it moved to, with a warning."""
    part = _MOVED.get(name)
    if part is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"raysim.tracking.{name} moved to raysim.tracking.{part}.{name}; the old name goes in "
        "the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"{__name__}.{part}"), name)
