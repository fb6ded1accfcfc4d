"""The project is self-contained: no file it ships names a file a user does not have.

Every tracked text file is read. A paper's implementation spec is in the project
(``docs/specs/<paper>.md``) and is cited as "FedOA spec §2.9"; a bare ``fedoa.md`` in prose would
point at the working notes it was written from, which a clone does not have. Markdown links are
checked by ``tests/test_links.py``.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT

PAPERS = ("fedoa", "feddle", "fedbaf", "fedot")
#: what a clone does not have: the team's notes, the papers' text files, a sibling folder
OUTSIDE = [
    (r"\.\./shared\b|(?<![\w/-])shared/(?:specs|seeds)/", "a folder beside the repository"),
    (r"\b(?:DESIGN|ENVIRONMENT|ARCHITECTURE-ANCHORS)\.md\b", "a team note outside the repository"),
    (r"\b\d{3}_[0-9a-f]{16}\.txt\b", "a paper's text file (cite the paper instead)"),
    (r"\b(?:papers?|seeds?) 00\d\b", "a paper by its file's label (cite the paper instead)"),
    (
        rf"(?<![\w/-])(?<!\]\()(?:{'|'.join(PAPERS)})\.md\b",
        "a spec by its bare file name (write 'FedOA spec §N'; the spec is docs/specs/)",
    ),
]
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg", ".ini", ".json", ""}


def shipped_text_files() -> list[str]:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    this = "tests/test_self_contained.py"
    return [f for f in tracked if f != this and (ROOT / f).suffix in TEXT and (ROOT / f).is_file()]


def outside_references(text: str) -> list[tuple[int, str, str]]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, why in OUTSIDE:
            for match in re.finditer(pattern, line):
                found.append((number, match.group(0), why))
    return found


def test_no_shipped_file_names_a_file_outside_the_repository():
    bad = []
    for name in shipped_text_files():
        try:
            text = (ROOT / name).read_text()
        except UnicodeDecodeError:
            continue
        bad += [f"{name}:{n}: {hit!r} ({why})" for n, hit, why in outside_references(text)]
    assert not bad, f"{len(bad)} references outside the repository:\n" + "\n".join(bad[:40])


@pytest.mark.parametrize(
    "line",
    [
        "see ../shared/specs/fedoa.md §2.9",
        "as DESIGN.md §1 says",
        "the paper (003_7f305b563e3a9189.txt)",
        "FedOA (papers 000/001; FedOA spec §2)",
        "(fedoa.md §2.9)",
        "fedbaf.md §4.4's E/λ",
    ],
)
def test_the_check_catches_each_kind_of_outside_reference(line):
    assert outside_references(line)


@pytest.mark.parametrize(
    "line",
    [
        "(FedOA spec §2.9)",
        "[FedBaF](papers/fedbaf.md)",
        "[the spec](../specs/fedot.md#3-baselines)",
        "clients.state.dir=/mnt/shared/raysim-states",
    ],
)
def test_the_check_passes_what_the_repository_holds(line):
    assert not outside_references(line)


def test_each_paper_has_its_spec_and_its_citation():
    for paper in PAPERS:
        spec = (ROOT / "docs/specs" / f"{paper}.md").read_text()
        page = (ROOT / "docs/papers" / f"{paper}.md").read_text()
        assert spec.startswith("# ") and "implementation spec" in spec.splitlines()[0]
        assert re.search(r"arxiv\.org/abs/\d{4}\.\d{5}", spec), paper
        first = page.split("\n\n")[1]
        assert first.startswith("Paper: ") and re.search(r"arxiv\.org/abs/\d{4}\.\d{5}", first)
        assert f"../specs/{paper}.md" in page, f"docs/papers/{paper}.md links its spec"
