"""The docs stay true: ``docs/adding-a-method.md``'s example runs exactly as the page says."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.conftest import ROOT, fresh_cli

DOC = ROOT / "docs" / "adding-a-method.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_docs_name_only_files_that_exist():
    for page in (DOC, ROOT / "docs" / "architecture.md"):
        for path in re.findall(
            r"`((?:raysim|tests|examples)/[\w/.-]+\.(?:py|yaml|json))`", page.read_text()
        ):
            assert (ROOT / path).is_file(), f"{page.name} names {path}"


@pytest.mark.slow
def test_adding_a_method_example_runs_from_the_cli(tmp_path):
    """Save the page's Python block as the file it names and run the page's command (shortened:
    2 rounds, no MLflow) in a fresh process with a real Ray."""
    code = blocks("python")[0]
    name = re.match(r"# (\S+\.py)", code).group(1)
    (tmp_path / name).write_text(code)
    command = next(c for c in blocks("bash")[0].splitlines() if c.startswith("raysim run"))
    argv = shlex.split(command)
    argv = [str(ROOT / a) if a.startswith("examples/") else a for a in argv]
    argv += ["rounds=2", "tracking.enabled=false", "workers.count=1"]
    out = fresh_cli(argv[1:], tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "fedmedian" in out.stdout + out.stderr or "accuracy" in out.stdout
