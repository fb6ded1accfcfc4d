"""Layering rules of docs/architecture.md ("The packages"), checked on the import graph."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "raysim"
#: the method interface at the top of ``raysim/algorithms/``; every method lives in a subpackage
INTERFACE = (
    *("base", "context", "private", "hooks", "interface", "registry", "spec", "__init__"),
    "exact_sum",  # WeightedMean's exact sums, which the nodes' reducers load without torch
)
PAPERS = ("general", "fedoa", "feddle", "fedbaf", "fedot")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def raysim_imports(path: Path) -> set[str]:
    """The raysim modules ``path`` imports, anywhere in it (function bodies and TYPE_CHECKING
    blocks included), relative imports resolved; ``from pkg import sub`` counts as ``pkg.sub``."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for a in node.names:
                sub = f"{prefix}.{a.name}"
                target = sub if sub in MODULES else prefix
                if target in MODULES:
                    out.add(target)
    out.discard(module_name(path))
    return out


def import_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module in raysim's import graph."""
    graph = {m: raysim_imports(p) for m, p in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


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
    for path in sorted((ROOT / "algorithms").rglob("*.py")):
        roots = {m.split(".")[0] for m in imported_modules(path)}
        assert not roots & {"ray", "mlflow"}, path.name


def test_actors_know_no_paper():
    """The runtime reaches methods only through the registry and the base interfaces."""
    allowed = {
        "raysim.algorithms",
        "raysim.algorithms.base",
        "raysim.algorithms.context",  # ServerContext: what a strategy computes with
        "raysim.algorithms.exact_sum",  # the sums the nodes' reducers add (partial sums)
        "raysim.algorithms.hooks",  # the mixer and behaviour registries and composition
        "raysim.algorithms.registry",
    }
    for path in sorted((ROOT / "actors").glob("*.py")):
        mods = {m for m in imported_modules(path) if m.startswith("raysim.algorithms")}
        assert mods <= allowed, (path.name, mods - allowed)


def test_actors_reach_security_analysis_through_one_seam():
    """The leak auditor lives in ``raysim/security/``; the coordinator holds a ``LeakAuditor``
    and calls its ``check`` — the one analysis the Ray runtime imports from there — and tags
    its run by the auditing policy in force (``raysim.security.policy``: whether a run audits,
    its tags and warning), which is no analysis."""
    seam = {("raysim.security.audit", "LeakAuditor")}
    for path in sorted((ROOT / "actors").glob("*.py")):
        assert not path.stem.startswith("audit"), path.name
        used = set()
        for node in ast.walk(ast.parse(path.read_text())):
            module = getattr(node, "module", None) or ""
            if isinstance(node, ast.ImportFrom) and module.startswith("raysim.security"):
                used |= {(node.module, a.name) for a in node.names}
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("raysim.security") for a in node.names), path.name
        used = {(m, name) for m, name in used if m != "raysim.security.policy"}
        assert used <= seam, (path.name, used - seam)


def test_no_import_circle_inside_raysim():
    assert import_cycles() == []


def test_the_cycle_finder_finds_a_planted_circle(tmp_path, monkeypatch):
    """The check above can fail: two modules importing each other are reported."""
    pkg = tmp_path / "raysim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from raysim import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    monkeypatch.setitem(globals(), "ROOT", pkg)
    monkeypatch.setitem(globals(), "MODULES", {module_name(p): p for p in pkg.rglob("*.py")})
    assert import_cycles() == [["raysim.a", "raysim.b"]]


def test_interface_modules_import_no_method():
    """The top of ``raysim/algorithms/`` is the interface: it names built-in modules as strings
    (``registry.BUILTIN_SPECS``) and imports none of them."""
    for name in INTERFACE:
        path = ROOT / "algorithms" / f"{name}.py"
        bad = {m for m in raysim_imports(path) if m.split(".")[2:3] and m.split(".")[2] in PAPERS}
        assert not bad, (name, bad)


def test_every_method_lives_in_a_subpackage():
    top = {p.stem for p in (ROOT / "algorithms").glob("*.py")}
    assert top == set(INTERFACE), top - set(INTERFACE)
    subpackages = {p.name for p in (ROOT / "algorithms").iterdir() if (p / "__init__.py").exists()}
    assert subpackages == set(PAPERS)


def test_a_paper_imports_no_other_paper():
    """A paper's package builds on the interface and ``general/``, never on another paper."""
    for paper in PAPERS[1:]:
        for path in sorted((ROOT / "algorithms" / paper).rglob("*.py")):
            others = {
                m.split(".")[2]
                for m in raysim_imports(path)
                if m.startswith("raysim.algorithms.") and m.split(".")[2] in PAPERS
            } - {paper, "general"}
            assert not others, (path.name, others)
