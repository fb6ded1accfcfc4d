"""MLflow: the store (``store``), one run's writer (``tracker``) and the process it runs in
(``process``), a run's tables and plots (``artifacts``), and the timeline of what each process
did (``timeline``). The coordinator is the only writer."""

from __future__ import annotations

from ..util.lazy import lazy_getattr

_STORE = (
    *(
        "LOOPBACK",
        "NODE_TAG",
        "RESTRICTED_TAG",
        "SESSION_TAG",
        "STORE_HOME",
        "create_sqlite_schema",
    ),
    *("default_tracking_uri", "ensure_experiment", "node_local", "open_store", "quiet_mlflow"),
    *("relocate_store", "schema_template", "store_lock", "store_path"),
)
_ARTIFACTS = ("plot_curves", "rows_csv", "write_clients_csv", "write_rows_csv")

#: the names of the old module ``raysim.tracking`` and the module each moved to (removed in the
#: next release)
_MOVED = {
    **dict.fromkeys(_STORE, ".store"),
    **dict.fromkeys(_ARTIFACTS, ".artifacts"),
    "Tracker": ".tracker",
}

__getattr__ = lazy_getattr(__name__, _MOVED, moved=True)
