"""Link check of the docs, two ways (``make docs`` runs both; ``tests/test_links.py`` tests it).

- ``site``: every ``href``/``src`` of every page of the built site (``site/``) that is not an
  outside address reaches a file of the site, and its ``#anchor``, if any, an ``id`` of that page.
- ``forge``: every relative link of every Markdown file in the repository reaches a file or
  folder of the repository, as a forge (GitHub, GitLab) shows the files: a page read there, not
  on the site, must not lead nowhere.

    python docs/hooks/check_links.py site [SITE_DIR]
    python docs/hooks/check_links.py forge

Exits 1 and lists each broken link (file, target) when there is one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[2]
#: ``[text](target)`` and ``![alt](target "title")``; a target has no spaces
MD_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def outside(target: str) -> bool:
    """An address elsewhere (a scheme or a host), not a file of the site or the repository."""
    parts = urlsplit(target)
    return bool(parts.scheme or parts.netloc)


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name"):
                self.ids.add(value)
            elif (name == "href" and tag in ("a", "link")) or (name == "src" and tag == "img"):
                self.refs.append(value)


def site_problems(site: Path) -> list[str]:
    """Broken links of the built site in ``site``, as ``page: target (why)``."""
    pages: dict[Path, _Refs] = {}
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html" and page.parent == site:
            continue  # a server's page for a missing address, its links absolute by design
        parsed = _Refs()
        parsed.feed(page.read_text(encoding="utf-8", errors="replace"))
        pages[page.resolve()] = parsed
    problems = []
    for page, parsed in pages.items():
        for ref in parsed.refs:
            if outside(ref) or ref.startswith(("mailto:", "javascript:", "data:")):
                continue
            parts = urlsplit(ref)
            target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            name = page.relative_to(site.resolve())
            if not target.exists():
                problems.append(f"{name}: {ref} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{name}: {ref} (no such anchor)")
    return problems


def markdown_files() -> list[Path]:
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / f for f in tracked if (ROOT / f).is_file()]


def markdown_problems(files: list[Path], root: Path = ROOT) -> list[str]:
    """Relative links of ``files`` that reach nothing inside ``root``, as ``file: target``."""
    problems = []
    for md in files:
        text = CODE.sub("", FENCE.sub("", md.read_text(encoding="utf-8")))
        for target in MD_LINK.findall(text):
            if outside(target) or target.startswith(("#", "mailto:")):
                continue
            path = unquote(urlsplit(target).path)
            resolved = (md.parent / path).resolve()
            inside = resolved == root.resolve() or root.resolve() in resolved.parents
            if not inside or not resolved.exists():
                why = "outside the repository" if not inside else "no such file"
                problems.append(f"{md.relative_to(root)}: {target} ({why})")
    return problems


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("site", "forge"):
        print(__doc__)
        return 2
    if argv[0] == "site":
        site = Path(argv[1]) if len(argv) > 1 else ROOT / "site"
        problems = site_problems(site)
        what = f"pages of {site}"
    else:
        problems = markdown_problems(markdown_files())
        what = "Markdown files, as a forge shows them"
    for line in problems:
        print(line)
    print(f"link check ({what}): {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
