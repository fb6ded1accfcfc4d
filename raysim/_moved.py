"""The modules that moved into packages, still importable by their old names for one release.

``import raysim.checkpoint`` (or ``from raysim.plan import RunPlan``) gives the module at its new
path, the same object (so patching either name patches both), with a ``DeprecationWarning``
naming the new path. The table is the list of moves in ``CHANGELOG.md``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: old module name → where it lives now (removed after the next release)
MOVED = {
    "raysim.plan": "raysim.launch.plan",
    "raysim.without_ray": "raysim.launch.without_ray",
    "raysim.resources": "raysim.launch.resources",
    "raysim.ray_start": "raysim.launch.private_ray",
    "raysim.placement": "raysim.launch.placement",
    "raysim.inputs": "raysim.launch.inputs",
    "raysim.sizes": "raysim.launch.sizes",
    "raysim.checkpoint": "raysim.state.checkpoint",
    "raysim.checkpoint_files": "raysim.state.checkpoint_files",
    "raysim.state_codec": "raysim.state.codec",
    "raysim.state_store": "raysim.state.store",
    "raysim.tracking_process": "raysim.tracking.process",
    "raysim.timeline": "raysim.tracking.timeline",
    "raysim.clock": "raysim.sim.clock",
    "raysim.delays": "raysim.sim.delays",
    "raysim.runtime": "raysim.sim.build",
    "raysim.metrics": "raysim.training.text_metrics",
    "raysim.lazy": "raysim.util.lazy",
    "raysim.quiet": "raysim.util.quiet",
    "raysim.private_files": "raysim.util.private_files",
    "raysim.machine": "raysim.util.machine",
    "raysim.buffers": "raysim.util.buffers",
    "raysim.audit_policy": "raysim.security.policy",
    "raysim.protocols": "raysim.sweeps.protocols",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path (kept under both names)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=3,
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__  # the import system overwrites it: put back in exec_module
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None):  # noqa: ANN201
        new = MOVED.get(name)
        return None if new is None else importlib.machinery.ModuleSpec(name, _Alias(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``raysim/__init__.py`` does)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
