"""The offline HTML report (`run.to_html`, `neuraldbg report`): one self-contained file that
names the first failure of a real training, with no external resource, and opens from disk
in Chromium with no console error."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from faults import STEPS, S, weight_x1000
from models import mlp, train

import neuraldbg_nb as ndbg
from neuraldbg_nb.cli import main

CHROMIUM = os.environ.get("NDBG_CHROMIUM", "/usr/bin/chromium")


def _broken() -> tuple[ndbg.Run, str]:
    setup = mlp()
    layer = setup.layers["mid"]
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, **weight_x1000(setup, layer))
    return run, layer


def _healthy() -> ndbg.Run:
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS)
    return run


class _Page(HTMLParser):
    """The page's visible text and every URL-bearing attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.urls: list[str] = []
        self.tags: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)
        self._skip += tag in ("style", "title")
        self.urls += [v or "" for k, v in attrs if k in ("src", "href", "xlink:href", "action")]

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("style", "title")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _self_contained(path: Path) -> None:
    raw = path.read_text(encoding="utf-8")
    page = _parse(path)
    assert not [u for u in page.urls if re.match(r"\s*(https?:)?//", u)], page.urls
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags
    assert not re.search(r"url\(|@import|https?://", raw), "an external resource in the page"


def test_a_live_run_report_names_the_failure_and_its_captured_numbers(tmp_path) -> None:
    run, layer = _broken()
    root = run.first_failure
    assert root is not None and (root.layer, root.step) == (layer, S)
    path = run.to_html(tmp_path / "report.html")
    _self_contained(path)
    text = " ".join(" ".join(_parse(path).text).split())
    assert f"First failure: step {S}, layer {layer}" in text
    assert root.message in text
    for cause in run.likely_causes:  # the fault edits the weights outside the optimizer
        assert str(cause) in text
    assert "Captured steps" in text and f"{layer}, step {S} (event)" in text
    assert "grad_norm" in text and "non-finite" in text  # the inspector's numbers
    assert "<svg" in path.read_text() and "health map" in path.read_text()


def test_the_command_writes_a_saved_runs_report(tmp_path, capsys) -> None:
    run, layer = _broken()
    saved = run.save(tmp_path / "run.npz")
    assert main(["report", str(saved), "-o", str(tmp_path / "out.html")]) == 0
    assert "report written to" in capsys.readouterr().out
    path = tmp_path / "out.html"
    _self_contained(path)
    text = " ".join(" ".join(_parse(path).text).split())
    assert f"First failure: step {S}, layer {layer}" in text
    assert "captured tensors are not saved with a run" in text
    assert main(["report", str(saved)]) == 0  # default: beside the run
    assert (tmp_path / "run.html").is_file()


def test_a_healthy_run_report_says_no_failure(tmp_path) -> None:
    path = _healthy().to_html(tmp_path / "healthy.html")
    text = " ".join(" ".join(_parse(path).text).split())
    assert "no failure found" in text and "First failure: step" not in text


@pytest.mark.browser
def test_the_report_opens_offline_in_chromium_without_errors(tmp_path) -> None:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(f"the browser test needs Chromium at {CHROMIUM} (or NDBG_CHROMIUM)",
                    pytrace=False)
    from playwright.sync_api import sync_playwright

    run, layer = _broken()
    path = run.to_html(tmp_path / "report.html")
    errors: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        try:
            context = browser.new_context(offline=True, viewport={"width": 1000, "height": 900})
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            body = page.inner_text("body")
            svg = page.locator("svg").count()
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert not errors, errors
    assert requests == [path.as_uri()], requests  # the page asks for nothing else
    assert f"First failure: step {S}, layer {layer}" in " ".join(body.split())
    assert svg >= 2  # the loss and the health map
