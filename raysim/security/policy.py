"""Whether a run's leak auditor is on (``audit.leaks``), decided from the config alone.

``true`` and ``false`` say it outright; ``auto`` (the default) turns it on exactly where the run
declares server-private values: its method's or a ``hooks.server`` mixer's spec says ``secrets``
(a strategy or mixer that overrides ``secrets()``, ``docs/leak-auditor.md``). Torch-free: the
plan, the coordinator and the MLflow tag read the same answer before any model loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raysim.algorithms.registry import MIXERS, method_spec

if TYPE_CHECKING:
    from raysim.config import RunConfig

#: the MLflow run's tag: ``on`` or ``off``, the auditor as the run had it
AUDIT_TAG = "raysim.audit.leaks"


def secrets_declared_by(cfg: RunConfig) -> list[str]:
    """The method and ``hooks.server`` mixers of ``cfg`` that declare server-private values."""
    names = [cfg.algorithm.name] if method_spec(cfg.algorithm.name).secrets else []
    return names + [h.name for h in cfg.hooks.server if MIXERS.spec(h.name).secrets]


def audits_leaks(cfg: RunConfig) -> bool:
    """Whether the run's coordinator checks every payload to clients (``audit.leaks``)."""
    leaks = cfg.audit.leaks
    return bool(secrets_declared_by(cfg)) if leaks == "auto" else leaks


def audit_off_warning(cfg: RunConfig) -> str | None:
    """The line a run shows when ``audit.leaks: false`` turns the auditor off over declared
    server-private values; None otherwise."""
    declared = secrets_declared_by(cfg)
    if cfg.audit.leaks is not False or not declared:
        return None
    return (
        f"audit.leaks=false: the leak auditor is off, though {' and '.join(declared)} declares "
        "server-private values; no payload to clients is checked for them"
    )


def audit_plan_line(cfg: RunConfig) -> str:
    """The plan's line on the auditor: on or off, and why."""
    declared = " and ".join(secrets_declared_by(cfg))
    if cfg.audit.leaks == "auto":
        if declared:
            return f"leak auditor: on ({declared} declares server-private values)"
        return "leak auditor: off (no server-private values declared)"
    if cfg.audit.leaks:
        return "leak auditor: on (audit.leaks=true)"
    why = f"; {declared} declares server-private values" if declared else ""
    return f"leak auditor: off (audit.leaks=false{why})"


def audit_tags(cfg: RunConfig) -> dict[str, str]:
    """The run's MLflow tag on the auditor."""
    return {AUDIT_TAG: "on" if audits_leaks(cfg) else "off"}
