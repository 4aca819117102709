"""The panel when its kernel is gone, and a baseline run beside the map, in a real browser
(JupyterLab 4 and Notebook 7, headless Chromium).

One notebook: a healthy run and a run of the same recipe whose layer "2" weights are
multiplied by 1000 at step 30 of 60, each under `%%neuraldbg`, then
`ndbg.show(broken, baseline=healthy)`. Checked: the shown panel says where the runs part
(step 30, layer 2) and lists the events only the broken run has; while the kernel lives the
static copy of the diagnosis is hidden; after the kernel is shut down, a click on the first
failure says the kernel is gone within `ANSWER_S`, and the static copy shows; after saving, starting a new kernel (a restart) and reloading, the broken cell's
output shows the static diagnosis naming layer 2 and step 30, visible, not a widget
placeholder alone. Screenshots go to tests/artifacts/kernel-<ui>/.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from _jupyter import LAB, NOTEBOOK7, TWO_RUNS_SETUP, UI, Server
from test_browser import (  # noqa: F401 - `jupyter` is the module's server fixture
    _cell,
    _page,
    _run_cell,
    _wait_done,
    jupyter,
)

pytestmark = pytest.mark.browser

REQUEST_TIMEOUT_S = 5.0
"""`REQUEST_TIMEOUT_MS` of js/requests.ts, in seconds."""
ANSWER_S = REQUEST_TIMEOUT_S + 1.5
"""A click on a panel whose kernel is gone says so within this (seconds): at once where the
widget manager reports the lost kernel, else when the request times out."""

SETUP = TWO_RUNS_SETUP
HEALTHY = "%%neuraldbg\nmodel_a, opt_a = recipe()\ntrain(model_a, opt_a)"
BROKEN = "%%neuraldbg\nmodel_b, opt_b = recipe()\ntrain(model_b, opt_b, fault_at=30)"
SHOW = "ndbg.show(ndbg.runs[1], baseline=ndbg.runs[0]);"
CELLS = [SETUP, HEALTHY, BROKEN, SHOW]


@pytest.mark.parametrize("ui", [LAB, NOTEBOOK7], ids=lambda ui: ui.name)
def test_a_panel_outlives_its_kernel(jupyter: tuple[Server, Any], ui: UI) -> None:  # noqa: F811
    server, browser = jupyter
    with _page(server, browser, ui, CELLS, f"kernel-{ui.name}") as (page, notebook, out):
        report: dict[str, Any] = {"ui": ui.title}
        try:
            _drive(server, page, ui, notebook, out, report)
        except BaseException:
            page.screenshot(path=str(out / "failure.png"), full_page=True)
            raise
        finally:
            (out / "report.json").write_text(json.dumps(report, indent=1, default=str))


def _drive(server: Server, page: Any, ui: UI, notebook: str, out: Path,
           report: dict[str, Any]) -> None:
    from playwright.sync_api import expect

    page.set_default_timeout(30_000)
    page.goto(server.url(notebook, ui))
    expect(page.locator(".jp-Notebook .jp-Cell")).to_have_count(len(CELLS), timeout=60_000)
    for ready in ui.kernel_ready:
        page.wait_for_selector(ready, timeout=60_000)
    for i in range(len(CELLS)):
        _run_cell(page, i)
        _wait_done(page, i, i + 1, timeout_ms=90_000)
    broken = _cell(page, 2).locator(".ndbg-panel")
    shown = _cell(page, 3).locator(".ndbg-panel")
    expect(broken).to_have_attribute("data-status", "finished")
    expect(broken.locator(".ndbg-first-failure")).to_have_attribute("data-step", "30")

    # the baseline beside the map: where the runs part, and what only the broken run has
    base = shown.locator(".ndbg-baseline")
    expect(base).to_be_visible()
    expect(base.locator(".ndbg-baseline-parting")).to_have_text("parts at step 30, layer 2")
    expect(base.locator(".ndbg-baseline-sentence")).to_contain_text("part at step 30, layer 2")
    expect(base.locator(".ndbg-baseline-only-run li").first).to_be_visible()
    report["baseline"] = base.inner_text()
    _cell(page, 3).evaluate("c => c.scrollIntoView({block: 'start'})")
    shown.screenshot(path=str(out / "01-baseline.png"))

    # while the kernel lives: the live panel, not a second copy
    static = _cell(page, 2).locator(".ndbg-static")
    expect(static).to_be_hidden()

    # the kernel shut down: a click says so in the stated time, the static copy shows
    report["shut_down_by"] = _shut_down(server, page)
    time.sleep(1.0)
    _cell(page, 2).evaluate("c => c.scrollIntoView({block: 'start'})")
    clicked = time.monotonic()
    broken.locator(".ndbg-first-failure").click()
    alert = broken.locator(".ndbg-alert")
    expect(alert).to_be_visible(timeout=int(ANSWER_S * 1000) + 500)
    report["answer_s"] = round(time.monotonic() - clicked, 2)
    expect(alert).to_contain_text("kernel")
    report["alert"] = alert.inner_text()
    expect(alert).to_contain_text("the kernel is gone")
    expect(broken).to_have_attribute("data-kernel", "gone")
    expect(static).to_be_visible()
    expect(static).to_contain_text("step 30")
    page.screenshot(path=str(out / "02-kernel-gone.png"), full_page=True)
    assert report["answer_s"] < ANSWER_S, report

    # save, a new kernel (a restart), reload: the static diagnosis, visible
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=15_000)
    time.sleep(1.0)
    page.goto(server.url(notebook, ui).replace("&reset", ""))
    expect(page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1)).to_be_attached(
        timeout=60_000)
    for ready in ui.kernel_ready:
        page.wait_for_selector(ready, timeout=60_000)
    sessions = server.api("sessions")
    report["kernels_after_reload"] = len(sessions)
    for s in sessions:  # restart the new kernel too: what "restart and reload" leaves
        server.api(f"kernels/{s['kernel']['id']}/restart", method="POST")
    time.sleep(2.0)
    static = _cell(page, 2).locator(".ndbg-static")
    expect(static).to_be_visible(timeout=15_000)
    text = static.inner_text()
    report["after_reload"] = text[:600]
    assert "step 30" in text and re.search(r"(^|\s)2 \(Linear\)", text), text
    output = _cell(page, 2).locator(".jp-OutputArea").inner_text()
    report["output_after_reload"] = output[:800]
    _cell(page, 2).evaluate("c => c.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(out / "03-after-restart.png"), full_page=True)


def _shut_down(server: Server, page: Any) -> str:
    """Shut the notebook's kernel down as a user does (Kernel > Shut Down Kernel, confirmed
    where the UI asks), else through the server (a kernel that died)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    menu = page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Kernel$"))
    if menu.count():
        menu.first.click()
        item = page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Shut Down Kernel$"))
        if item.count():
            item.first.click()
            accept = page.locator(".jp-Dialog .jp-mod-accept")
            with contextlib.suppress(PlaywrightTimeout):  # no confirmation asked
                accept.wait_for(timeout=2_000)
                accept.click()
            return "menu"
        page.keyboard.press("Escape")
    for kernel in server.api("kernels"):
        server.api(f"kernels/{kernel['id']}", method="DELETE")
    return "server"
