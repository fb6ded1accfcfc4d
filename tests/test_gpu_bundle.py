"""The GPU machine's bundle (benchmarks/gpu_bundle.sh), its environment (benchmarks/gpu_env.sh)
and the image guard (benchmarks/gpu_image/sitecustomize.py), checked in seconds with no network
and no bundle built: the guard on fake modules in subprocesses, gpu_env.sh on a fake bundle,
and the bundle's pins against requirements.txt."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUNDLE_SH = ROOT / "benchmarks" / "gpu_bundle.sh"
ENV_SH = ROOT / "benchmarks" / "gpu_env.sh"
GUARD_DIR = ROOT / "benchmarks" / "gpu_image"
#: on the image too, carried all the same: peft at the project's pin (the image's version is not
#: known), typing_extensions at least what pydantic 2.14 needs
ALSO_ON_IMAGE = {"peft", "typing-extensions"}
#: the image's own: never carried (their versions there are the image's)
NEVER_CARRIED = {"torch", "transformers", "numpy", "pandas", "pyarrow", "safetensors",
                 "tokenizers", "accelerate", "huggingface-hub"}  # fmt: skip


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def bash_array(text: str, name: str) -> list[str]:
    """The words of the bash array ``NAME=(...)`` in ``text`` (on one line, or closed by a line
    ``)``), comments left out."""
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith(f"{name}=("):
            break
    else:
        raise AssertionError(f"no {name}=( ... ) in gpu_bundle.sh")
    body = [line[len(name) + 2 :]]
    if body[0].rstrip().endswith(")"):
        body[0] = body[0].rstrip()[:-1]
    else:
        body += [next(lines)]
        while body[-1].strip() != ")":
            body.append(next(lines))
        body.pop()
    return [word for part in body for word in part.split("#", 1)[0].split()]


def bundle_pins() -> list[str]:
    text = BUNDLE_SH.read_text()
    return bash_array(text, "WHEELS") + bash_array(text, "SDISTS")


def requirement_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[norm(name.split("[")[0])] = version.strip()
    return pins


def image_packages() -> set[str]:
    lines = (GUARD_DIR / "image_packages.txt").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def test_every_package_is_pinned_once_and_as_requirements_txt_pins_it():
    pins = bundle_pins()
    assert len(pins) > 20
    names = []
    for pin in pins:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*", pin), pin
        names.append(norm(pin.split("==")[0]))
    assert len(names) == len(set(names)), "a package named twice"
    required = requirement_pins()
    both = {n: v for n, v in (p.split("==") for p in pins) if norm(n) in required}
    assert {"ray", "mlflow", "pydantic", "peft", "deepspeed", "rouge-score"} <= {
        norm(n) for n in both
    }
    for name, version in both.items():
        assert version == required[norm(name)], f"{name}=={version} but requirements.txt pins " + (
            f"{required[norm(name)]}"
        )


def test_the_bundle_carries_only_what_the_image_lacks():
    image = image_packages()
    assert {"torch", "transformers", "numpy", "pytest", "pyyaml"} <= image
    assert all(n == norm(n) for n in image)
    carried = {norm(p.split("==")[0]) for p in bundle_pins()}
    assert carried & image == ALSO_ON_IMAGE
    assert not carried & NEVER_CARRIED


def test_gpu_bundle_sh_parses_and_refuses_unknown_arguments():
    assert subprocess.run(["bash", "-n", str(BUNDLE_SH)]).returncode == 0
    bad = subprocess.run(["bash", str(BUNDLE_SH), "--nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr
    helped = subprocess.run(["bash", str(BUNDLE_SH), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "--python local" in helped.stdout


# --- the image guard, in subprocesses (it acts at Python's start) -----------------------------


@pytest.fixture
def fake_site(tmp_path: Path) -> Path:
    """Modules and a distribution that the guard's list (``guard.txt``) refuses or hides."""
    site = tmp_path / "site"
    (site / "rsg_ns" / "sub").mkdir(parents=True)
    (site / "rsg_victim.py").write_text("X = 1\n")
    (site / "rsg_friend.py").write_text("X = 2\n")
    (site / "rsg_ns" / "kept.py").write_text("X = 3\n")  # a namespace shared by two dists
    (site / "rsg_ns" / "sub" / "__init__.py").write_text("X = 4\n")
    info = site / "rsg_victim-1.0.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text("Metadata-Version: 2.1\nName: rsg-victim\nVersion: 1.0\n")
    (tmp_path / "guard.txt").write_text(
        "# a test list\nallow rsg-friend rsg-image==1\ndist rsg-victim\n"
        "module rsg_victim rsg-victim\nmodule rsg_ns.sub rsg-victim\n"
    )
    return site


def run_python(code: str, site: Path, guard: bool, extra_path: list[Path] = ()) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYSIM_IMAGE")}
    path = [str(GUARD_DIR), str(site), *map(str, extra_path), str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(path)
    if guard:
        env["RAYSIM_IMAGE_GUARD"] = "1"
        env["RAYSIM_IMAGE_BLOCKED"] = str(site.parent / "guard.txt")
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


PROBE = """
    import importlib, importlib.metadata as md, importlib.util, json, sqlite3
    import raysim, rsg_friend, rsg_ns.kept
    for name in ("rsg_victim", "rsg_ns.sub"):
        try:
            importlib.import_module(name)
            print(name, "imported")
        except ModuleNotFoundError as e:
            print(name, "refused:", e.name, "|", e)
    try:
        import rsg_victim  # noqa
    except ImportError as e:
        print("statement refused:", e.name)
    print("probe:", importlib.util.find_spec("rsg_victim") is not None)
    try:
        print("version:", md.version("rsg-victim"))
    except md.PackageNotFoundError:
        print("version: hidden")
    print("stdlib and raysim:", json.__name__, sqlite3.__name__, raysim.__name__)
"""


def test_the_guard_refuses_what_the_image_lacks_and_allows_the_rest(fake_site):
    out = run_python(PROBE, fake_site, guard=True)
    assert "rsg_victim refused: rsg_victim | No module named 'rsg_victim': its distribution " in out
    assert "'rsg-victim' is not on the GPU image and not in the bundle" in out
    assert "rsg_ns.sub refused: rsg_ns.sub" in out  # below a namespace that another dist shares
    assert "statement refused: rsg_victim" in out
    assert "probe: False" in out  # importlib.util.find_spec answers as if it were not installed
    assert "version: hidden" in out
    assert "stdlib and raysim: json sqlite3 raysim" in out


def test_without_the_variable_the_guard_does_nothing(fake_site):
    out = run_python(PROBE, fake_site, guard=False)
    assert "rsg_victim imported" in out and "rsg_ns.sub imported" in out
    assert "probe: True" in out and "version: 1.0" in out


def test_the_guard_runs_the_sitecustomize_it_shadows(fake_site, tmp_path):
    later = tmp_path / "later"
    later.mkdir()
    (later / "sitecustomize.py").write_text("import os\nos.environ['RSG_CHAINED'] = 'yes'\n")
    code = "import os, sys; print(os.environ.get('RSG_CHAINED'), any("
    code += "type(f).__name__ == 'Guard' for f in sys.meta_path))"
    assert run_python(code, fake_site, guard=True, extra_path=[later]).split() == ["yes", "True"]


def test_the_guards_list_is_computed_from_the_installed_distributions(tmp_path):
    """What gpu_bundle.sh writes: a distribution on neither list is blocked and hidden; one an
    image package needs is allowed; the image's own and the bundle's are neither."""
    spec = importlib.util.spec_from_file_location("rsg_guard", GUARD_DIR / "sitecustomize.py")
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    import importlib.metadata as md

    installed = {norm(d.metadata["Name"]) for d in md.distributions()}
    assert {"pytest", "pluggy", "iniconfig", "packaging"} <= installed
    # an "image" of pytest alone (its needs: allowed), a "bundle" of packaging
    blocked, hidden, allowed = guard.compute({"pytest"}, {"packaging"})
    assert {"pluggy", "iniconfig"} <= set(allowed) and "pytest" in allowed["pluggy"]
    assert not {"pytest", "pluggy", "packaging"} & hidden
    assert "numpy" in hidden and ("raysim" in hidden or "raysim" not in installed)
    assert blocked.get("numpy") == "numpy"
    assert "pytest" not in blocked and "packaging" not in blocked and "raysim" not in blocked
    assert "json" not in blocked  # the standard library, never
    out = tmp_path / "guard.txt"
    guard.write(out, blocked, hidden, allowed)
    assert guard.load(out) == (blocked, hidden)


# --- gpu_env.sh on a fake bundle ---------------------------------------------------------------


def test_gpu_env_unpacks_once_and_sets_the_environment_under_set_u(tmp_path):
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks" / "gpu_env.sh").write_text(ENV_SH.read_text())
    (root / ".gpu").mkdir()
    staged = tmp_path / "staged"
    (staged / "rsg_bundled").mkdir(parents=True)
    (staged / "rsg_bundled" / "__init__.py").write_text("X = 5\n")
    (staged / "bin").mkdir()
    with tarfile.open(root / ".gpu" / "bundle-test.tar.xz", "w:xz") as tar:
        tar.add(staged, arcname=".")
    site = tmp_path / "site"
    script = f"""
        set -euo pipefail
        unset PYTHONPATH RAY_AUTH_MODE RAY_AUTH_TOKEN HF_HUB_OFFLINE RAYSIM_IMAGE_GUARD
        export RAYSIM_BUNDLE=test RAYSIM_SITE={site}
        source {root}/benchmarks/gpu_env.sh
        touch "$RAYSIM_SITE/marker"        # a second source must not unpack again
        source {root}/benchmarks/gpu_env.sh
        test -e "$RAYSIM_SITE/marker"
        echo "PYTHONPATH=$PYTHONPATH"
        echo "PATH1=${{PATH%%:*}}"
        echo "$RAY_AUTH_MODE $HF_HUB_OFFLINE $TRANSFORMERS_OFFLINE $TOKENIZERS_PARALLELISM"
        echo "token=${{#RAY_AUTH_TOKEN}}"
        {sys.executable} -c "import rsg_bundled; print('bundled', rsg_bundled.X)"
        RAYSIM_BUNDLE=missing; source {root}/benchmarks/gpu_env.sh || echo "missing: rc=$?"
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert f"PYTHONPATH={root}:{site}" in lines  # once each, sourced twice
    assert f"PATH1={site}/bin" in lines
    assert "token 1 1 false" in lines and "token=64" in lines  # the call's Ray takes a token
    assert "bundled 5" in lines
    assert "missing: rc=1" in lines
    assert out.stderr.count("unpacked bundle-test.tar.xz") == 1
    assert (site / ".raysim-bundle").read_text().startswith("test ")
    # compiled at unpack, in place: no process compiles the bundle at its first import
    assert list((site / "rsg_bundled" / "__pycache__").glob("__init__.cpython-*.pyc"))
