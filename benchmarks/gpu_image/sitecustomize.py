"""The image guard: makes this machine's Python see only what the lent GPU machine will have.

The GPU machine runs its own image (KINDS.md lists its Python packages; ``image_packages.txt``
beside this file holds their names) plus the bundle that ``benchmarks/gpu_bundle.sh`` builds.
With ``RAYSIM_IMAGE_GUARD=1`` and this folder on PYTHONPATH (``benchmarks/gpu_env.sh`` puts it
there), every Python process, Ray's workers included (they inherit the environment), refuses:

- to import a top-level module (or, for a namespace shared with an allowed distribution such as
  ``google`` or ``opentelemetry``, a second-level one) that only a distribution installed here
  but neither on the image nor in the bundle provides: ModuleNotFoundError, naming it;
- to show such a distribution to ``importlib.metadata`` (``version()``, ``entry_points()``...),
  as it would not be there either.

The list is precomputed by gpu_bundle.sh into ``.gpu/guard-<tag>.txt`` (``RAYSIM_IMAGE_BLOCKED``
names it); without one it is computed here at start from ``image_packages.txt`` and the bundle
unpacked at ``RAYSIM_SITE``. The standard library and the repo's own ``raysim`` and ``tests`` are
never blocked. Versions are not checked: a package of the image may be another version here.

``python sitecustomize.py --write FILE --bundle-site DIR`` writes the list for the bundle whose
packages are installed in DIR (gpu_bundle.sh calls it with the venv's python, PYTHONPATH unset).
An earlier ``sitecustomize`` on the path (a venv's or the system's) still runs after this one.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.machinery import PathFinder

HERE = os.path.dirname(os.path.abspath(__file__))
#: modules never blocked besides the standard library: the repo's own, and editable finders
NEVER = {"raysim", "tests", "benchmarks", "sitecustomize", "usercustomize"}
MESSAGE = "not on the GPU image and not in the bundle"


def norm(name: str) -> str:
    """A distribution name as PEP 503 normalises it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_names(path: str) -> set[str]:
    """Normalised names, one a line, from ``path``; ``#`` starts a comment; ``name==version``
    lines (the bundle's list) give their name."""
    with open(path, encoding="utf-8") as f:
        lines = (line.split("#", 1)[0].strip() for line in f)
        return {norm(re.split(r"[=<>!~ ;\[]", line, maxsplit=1)[0]) for line in lines if line}


def _submodules(dist, top: str) -> set[str]:
    """``top.x`` for each module or package ``x`` that ``dist`` installs under ``top``."""
    out = set()
    for f in dist.files or ():
        parts = f.parts
        if len(parts) < 2 or parts[0] != top or "__pycache__" in parts:
            continue
        name = parts[1]
        if len(parts) == 2:
            if not name.endswith((".py", ".so", ".pyd")) or name.startswith("__init__."):
                continue
            name = name.split(".", 1)[0]
        if name.isidentifier():
            out.add(f"{top}.{name}")
    return out


def compute(image: set[str], bundle: set[str], skip_path: str | None = None):
    """What the guard refuses, from the distributions this Python sees (less those under
    ``skip_path``, the unpacked bundle): ``(blocked, hidden, allowed)``.

    ``blocked``: module -> the distribution that alone provides it here. ``hidden``: the
    distributions that importlib.metadata must not show. ``allowed``: distributions on neither
    list that a package of the image, as installed here, requires (a newer version here may
    need what the image's own does not: e.g. huggingface-hub 2.x's httpx2): left importable,
    since the image brings its own version's needs; gpu_bundle.sh prints them."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    skip = os.path.realpath(skip_path) + os.sep if skip_path else None
    dists = {}
    for d in md.distributions():
        path = getattr(d, "_path", None)
        if skip and path is not None and os.path.realpath(str(path)).startswith(skip):
            continue
        name = d.metadata["Name"]
        if name:
            dists.setdefault(norm(name), d)
    ok = set(image) | set(bundle)
    allowed: dict[str, str] = {}
    todo = [d for n, d in dists.items() if n in image]
    while todo:
        d = todo.pop()
        for r in d.requires or ():
            req = Requirement(r)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            n = norm(req.name)
            if n in dists and n not in ok and n not in allowed:
                allowed[n] = f"{d.metadata['Name']} {d.version}"
                todo.append(dists[n])
    ok |= set(allowed)
    provides: dict[str, list[str]] = {}
    for d in dists.values():
        top = set()
        txt = d.read_text("top_level.txt")
        if txt:
            top = {t.strip().split("/", 1)[0] for t in txt.split() if t.strip()}
        else:
            for f in d.files or ():
                first = f.parts[0]
                if first.endswith((".dist-info", ".egg-info", ".data")) or first == "..":
                    continue
                top.add(first.split(".", 1)[0] if len(f.parts) == 1 else first)
        for t in top:
            if t.isidentifier():
                provides.setdefault(t, []).append(norm(d.metadata["Name"]))
    stdlib = set(sys.stdlib_module_names)
    blocked: dict[str, str] = {}
    for mod, names in provides.items():
        if mod in stdlib or mod in NEVER or mod.startswith("__editable__"):
            continue
        good = [n for n in names if n in ok]
        bad = [n for n in names if n not in ok]
        if not bad:
            continue
        if not good:
            blocked[mod] = bad[0]
            continue
        # a namespace (google, opentelemetry) shared with an allowed distribution
        have = set().union(*(_submodules(dists[n], mod) for n in good))
        for n in bad:
            for sub in _submodules(dists[n], mod) - have:
                blocked.setdefault(sub, n)
    hidden = {n for n in dists if n not in ok}
    return blocked, hidden, allowed


def write(path: str, blocked: dict[str, str], hidden: set[str], allowed: dict[str, str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("# raysim image guard (benchmarks/gpu_image/sitecustomize.py): what this\n")
        f.write("# machine's Python has that the GPU image plus the bundle lack\n")
        for n, why in sorted(allowed.items()):
            f.write(f"allow {n} {why.replace(' ', '==')}\n")
        for n in sorted(hidden):
            f.write(f"dist {n}\n")
        for mod, n in sorted(blocked.items()):
            f.write(f"module {mod} {n}\n")


def load(path: str) -> tuple[dict[str, str], set[str]]:
    blocked: dict[str, str] = {}
    hidden: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "module":
                blocked[parts[1]] = parts[2]
            elif len(parts) == 2 and parts[0] == "dist":
                hidden.add(parts[1])
    return blocked, hidden


class Guard:
    """First on ``sys.meta_path``: an import of a blocked module fails with the reason. A probe
    (``importlib.util.find_spec``, as transformers' ``is_*_available`` and MLflow use) gets
    None, as where the module is not installed; ``GuardedPathFinder`` keeps the path from
    finding it then."""

    def __init__(self, blocked: dict[str, str]):
        self.blocked = blocked

    def find_spec(self, fullname, path=None, target=None):
        dist = self.blocked.get(fullname)
        if dist is None or not _importing():
            return None
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: its distribution {dist!r} is {MESSAGE} "
            "(RAYSIM_IMAGE_GUARD=1; add it to benchmarks/gpu_bundle.sh)",
            name=fullname,
        )

    def invalidate_caches(self):
        pass


class GuardedPathFinder:
    """``importlib.machinery.PathFinder`` that does not find the blocked modules."""

    def __init__(self, blocked: dict[str, str]):
        self.blocked = blocked

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.blocked:
            return None
        return PathFinder.find_spec(fullname, path, target)

    def invalidate_caches(self):
        return PathFinder.invalidate_caches()

    def find_distributions(self, *args, **kwargs):
        return PathFinder.find_distributions(*args, **kwargs)


def _importing() -> bool:
    """Whether the finder was asked by an import statement (importlib's
    ``_find_and_load_unlocked``, two frames up) rather than by a probe; True if unsure."""
    try:
        return sys._getframe(3).f_code.co_name == "_find_and_load_unlocked"
    except (AttributeError, ValueError):
        return True


def _hide(hidden: set[str]) -> None:
    import importlib.metadata as md

    discover = md.Distribution.discover.__func__

    def filtered(cls, **kwargs):
        for d in discover(cls, **kwargs):
            name = d.metadata["Name"]
            if name is None or norm(name) not in hidden:
                yield d

    md.Distribution.discover = classmethod(filtered)


def install() -> None:
    if os.environ.get("RAYSIM_IMAGE_GUARD") != "1" or any(
        isinstance(f, Guard) for f in sys.meta_path
    ):
        return
    listed = os.environ.get("RAYSIM_IMAGE_BLOCKED", "")
    if listed and os.path.isfile(listed):
        blocked, hidden = load(listed)
    else:
        image = read_names(os.path.join(HERE, "image_packages.txt"))
        site = os.environ.get("RAYSIM_SITE", "")
        bundle = set()
        if site and os.path.isdir(site):
            import importlib.metadata as md

            bundle = {norm(d.metadata["Name"]) for d in md.distributions(path=[site])}
        blocked, _hidden, _ = compute(image, bundle, site or None)
        hidden = _hidden
    sys.meta_path[:] = [GuardedPathFinder(blocked) if f is PathFinder else f for f in sys.meta_path]
    sys.meta_path.insert(0, Guard(blocked))
    _hide(hidden)


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, as Python would have without this one."""
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.realpath(p or ".") != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_raysim_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="write the image guard's list")
    parser.add_argument("--write", required=True, help="the list to write")
    parser.add_argument("--bundle-site", required=True, help="the folder the bundle installs")
    parser.add_argument("--image", default=os.path.join(HERE, "image_packages.txt"))
    args = parser.parse_args(argv)
    import importlib.metadata as md

    bundle = {norm(d.metadata["Name"]) for d in md.distributions(path=[args.bundle_site])}
    if not bundle:
        parser.error(f"no distributions in {args.bundle_site}")
    blocked, hidden, allowed = compute(read_names(args.image), bundle, args.bundle_site)
    write(args.write, blocked, hidden, allowed)
    for n, why in sorted(allowed.items()):
        print(f"guard: {n} left importable: the venv's {why} needs it (the image's may not)")
    print(f"guard: {len(blocked)} modules blocked, {len(hidden)} distributions hidden")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
elif __name__ == "sitecustomize":  # imported by Python's start (site), not by a test
    install()
    _chain()
