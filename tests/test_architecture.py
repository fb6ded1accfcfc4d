"""Layering rules of DESIGN.md §1, checked on the import graph (not by text search)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "raysim"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_algorithms_import_neither_ray_nor_mlflow():
    for path in sorted((ROOT / "algorithms").glob("*.py")):
        roots = {m.split(".")[0] for m in imported_modules(path)}
        assert not roots & {"ray", "mlflow"}, path.name


def test_actors_know_no_paper():
    """The runtime reaches methods only through the registry and the base interfaces."""
    allowed = {
        "raysim.algorithms",
        "raysim.algorithms.base",
        "raysim.algorithms.context",  # ServerContext: what a strategy computes with
        "raysim.algorithms.hooks",  # the mixer and behaviour registries and composition
        "raysim.algorithms.registry",
    }
    for path in sorted((ROOT / "actors").glob("*.py")):
        mods = {m for m in imported_modules(path) if m.startswith("raysim.algorithms")}
        assert mods <= allowed, (path.name, mods - allowed)
