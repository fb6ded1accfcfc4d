"""The docs site works opened from disk, as the README says to open it: built as ``make docs``
builds it, its pages load nothing from another host, and its search answers in a real headless
Chromium from ``file://``, with no server and no network (Material's offline plugin, with the
site's own worker shim, ``docs/assets/javascripts/iframe-worker.js``, in place of a CDN's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_ui_browser import CHROMIUM, FLAGS, needs_chromium

pytestmark = pytest.mark.matrix  # suite time (~60 s: a whole site build): the fast suite's budget


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(
        [str(mkdocs), "build", "--strict", "-q", "-d", str(out)], cwd=ROOT, env=env, check=True
    )
    return out


def test_no_page_loads_a_script_a_style_or_a_font_from_another_host(site):
    for page in [site / "index.html", site / "tutorials" / "1-first-run.html"]:
        html = page.read_text()
        loads = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', html)
        assert not loads, f"{page.name} loads {loads}"
        assert "assets/javascripts/iframe-worker.js" in html


@needs_chromium
def test_search_answers_on_the_site_opened_from_disk(site):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.goto((site / "index.html").as_uri())
        # the search opens as a reader's click or key opens it: the toggle's change event
        page.evaluate(
            "(() => { const c = document.getElementById('__search');"
            " c.checked = true; c.dispatchEvent(new Event('change')); })()"
        )
        field = page.locator("input.md-search__input").first
        meta = "document.querySelector('.md-search-result__meta').textContent.trim()"
        page.wait_for_function(f"{meta} !== 'Initializing search'", timeout=30_000)
        field.focus()
        page.keyboard.type("staleness", delay=30)
        page.locator(".md-search-result__item").first.wait_for(timeout=30_000)
        assert page.locator(".md-search-result__item").count() > 0
        assert "Glossary" in page.locator(".md-search-result").inner_text()
        browser.close()
