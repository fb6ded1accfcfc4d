"""The tutorials run as written and print what they show.

Each page of ``docs/tutorials/`` is followed in order, in one fresh folder (``examples/`` linked
in, a store of its own), as a reader would:

- a ``python`` block with a ``title="name.py"`` is written to that file;
- in a ``console`` block, a line ``$ command`` runs in bash (a line ending in ``\\`` continues
  it); the lines under it are the output the page shows. Each shown line must appear in the real
  output (stdout and stderr), in order, compared with runs of spaces collapsed (a table's width
  follows the terminal) and with ``…`` standing for any text. A reader's output has more lines
  (progress, timings), so lines may lie between the shown ones.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("[0-9]*.md"))
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def steps(page: Path) -> list[tuple[str, str, list[str]]]:
    """``("file", name, lines)`` and ``("run", command, expected lines)`` in page order."""
    out: list[tuple[str, str, list[str]]] = []
    for lang, attrs, body in BLOCK.findall(page.read_text()):
        title = re.search(r'title="([^"]+)"', attrs)
        if lang == "python" and title:
            out.append(("file", title.group(1), body.splitlines()))
        elif lang == "console":
            lines = body.splitlines()
            i = 0
            while i < len(lines):
                if not lines[i].startswith("$ "):
                    raise AssertionError(f"{page.name}: output before a command: {lines[i]!r}")
                command = lines[i][2:]
                while command.endswith("\\"):
                    i += 1
                    command = command[:-1] + lines[i].strip()
                i += 1
                shown = []
                while i < len(lines) and not lines[i].startswith("$ "):
                    shown.append(lines[i])
                    i += 1
                out.append(("run", command, shown))
    return out


def squash(line: str) -> str:
    return " ".join(line.split())


def line_pattern(shown: str) -> re.Pattern[str]:
    parts = [re.escape(part) for part in squash(shown).split("…")]
    return re.compile("^" + ".*".join(parts) + "$")


def missing_lines(shown: list[str], output: str) -> list[str]:
    """The shown lines not found, in order, in ``output`` (empty when all are)."""
    actual = [squash(line) for line in output.splitlines()]
    at = 0
    for line in shown:
        if not line.strip() or squash(line) == "…":
            continue
        pattern = line_pattern(line)
        while at < len(actual) and not pattern.match(actual[at]):
            at += 1
        if at == len(actual):
            return [line]
        at += 1
    return []


def test_the_comparison_finds_lines_in_order_and_only_then():
    output = "round 30/30 ━━ accuracy=0.92\n│ final accuracy   │   0.9192 │\nweights sha256: ab\n"
    assert not missing_lines(["│ final accuracy │ 0.91… │", "weights sha256: …"], output)
    assert missing_lines(["weights sha256: …", "│ final accuracy │ 0.91… │"], output)
    assert missing_lines(["│ final accuracy │ 0.80… │"], output)


@pytest.fixture(scope="module")
def reader():
    # A short folder: the run's table shows the store's path in a 100-column terminal, and
    # pytest's own temporary paths (longer under xdist: ``popen-gw0``) would be cut there.
    here = Path(tempfile.mkdtemp(prefix="tut-"))
    (here / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_ADDRESS"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["COLUMNS"] = "100"
    yield here, env
    shutil.rmtree(here, ignore_errors=True)


def test_there_is_a_tutorial_track():
    assert len(TUTORIALS) >= 4, [p.name for p in TUTORIALS]
    for page in TUTORIALS:
        assert any(kind == "run" for kind, _, _ in steps(page)), page.name


@pytest.mark.matrix  # suite time (~90 s on 2 vCPUs for the four): the fast suite's budget
@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_a_tutorial_runs_and_prints_what_it_shows(page, reader):
    here, env = reader
    for kind, what, lines in steps(page):
        if kind == "file":
            (here / what).write_text("\n".join(lines) + "\n")
            continue
        done = subprocess.run(
            ["bash", "-c", what], cwd=here, env=env, capture_output=True, text=True, timeout=600
        )
        output = done.stdout + done.stderr
        lost = missing_lines(lines, output)
        assert not lost, f"{page.name}: `{what}` did not print {lost[0]!r}; it printed:\n{output}"
