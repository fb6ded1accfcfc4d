"""The docs' link check (``docs/hooks/check_links.py``, run by ``make docs``): it finds each kind
of broken link, and the repository's Markdown has none as a forge shows it."""

from __future__ import annotations

import importlib.util

from tests.conftest import ROOT


def checker():
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "docs/hooks/check_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_check_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="sub/b.html#there">ok</a> <a href="sub/b.html#nowhere">anchor</a>'
        '<a href="gone.html">page</a> <a href="https://example.org/x">outside</a>'
        '<a href="#top">self</a><h1 id="top">t</h1><img src="sub/pic.png">'
    )
    (tmp_path / "sub" / "b.html").write_text('<h2 id="there">b</h2><a href="../index.html">up</a>')
    (tmp_path / "sub" / "pic.png").write_bytes(b"png")
    problems = checker().site_problems(tmp_path)
    assert problems == [
        "index.html: sub/b.html#nowhere (no such anchor)",
        "index.html: gone.html (no such file)",
    ]


def test_the_forge_check_finds_a_missing_file_and_a_path_outside(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# there\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[ok](there.md#x) [missing](nothere.md) [out](../../elsewhere/notes.md)\n"
        "![img](pic.png) [web](https://example.org) [self](#a)\n"
        "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
    )
    problems = checker().markdown_problems([page], root=tmp_path)
    assert problems == [
        "docs/page.md: nothere.md (no such file)",
        "docs/page.md: ../../elsewhere/notes.md (outside the repository)",
        "docs/page.md: pic.png (no such file)",
    ]


def test_every_relative_link_of_the_repositorys_markdown_reaches_a_file():
    module = checker()
    assert not module.markdown_problems(module.markdown_files())
