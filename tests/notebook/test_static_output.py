"""The diagnosis outlives the panel's kernel: when a `%%neuraldbg` cell ends, the diagnosis
follows the panel as text/plain and text/html, so a notebook executed, saved and exported
with `jupyter nbconvert --to html` names the first failure's layer and step once, with no
kernel; and `ndbg.show` opens a saved run's panel, with clicks and sliders."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from faults import STEPS, S, weight_x1000
from models import mlp, train
from panels import shown_panel

import neuraldbg_nb as ndbg

WIDGET = "application/vnd.jupyter.widget-view+json"
PROJECT = Path(__file__).resolve().parents[2]
KERNEL = "python3"

NOTEBOOK_CELLS = ["""\
import torch
from torch import nn
import neuraldbg_nb as ndbg
%load_ext neuraldbg_nb
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(0)
X = torch.randn(4096, 16, generator=g); Y = X[:, :4].argmax(1)""", """\
%%neuraldbg
for step in range(80):
    i = step * 32 % 4000
    if step == 50:
        with torch.no_grad():
            model[2].weight.mul_(1000)
    opt.zero_grad()
    nn.functional.cross_entropy(model(X[i:i + 32]), Y[i:i + 32]).backward()
    opt.step()""", """\
run = ndbg.last_run()
print("FIRST", run.first_failure.layer, run.first_failure.step)"""]


def _broken() -> tuple[ndbg.Run, str]:
    setup = mlp()
    layer = setup.layers["mid"]
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, **weight_x1000(setup, layer))
    return run, layer


def test_the_diagnosis_output_and_the_panels_own() -> None:
    from neuraldbg_nb.notebook.panel import Panel
    from neuraldbg_nb.notebook.static import PANEL_ROOT, diagnosis_bundle

    run, layer = _broken()
    panel = Panel(run)
    try:
        bundle = panel._repr_mimebundle_()
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        assert data[WIDGET]["model_id"] == panel.model_id  # the live view
        assert "object at 0x" not in data["text/plain"] and "text/html" not in data
    finally:
        panel.close()
    static = diagnosis_bundle(run)
    assert static["text/plain"] == str(run)
    html = static["text/html"]
    assert f"First failure: step {S}, layer {layer}" in html
    assert "<svg" in html and "<script" not in html
    assert not re.search(r"(src|href)=\S*https?:", html)
    # hidden only where the live panel's root is drawn before it (js/index.ts names it)
    assert f'"{PANEL_ROOT}"' in (PROJECT / "js" / "index.ts").read_text()


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A `python3` kernelspec for this interpreter, first on the Jupyter path, and the
    checkout importable in the kernel; the environment for `jupyter nbconvert` too."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (neuraldbg_nb tests)", "language": "python"}))
    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "PYTHONPATH")}
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root), *filter(None, [saved["JUPYTER_PATH"]])])
    os.environ["PYTHONPATH"] = os.pathsep.join([str(PROJECT), *filter(None, [saved["PYTHONPATH"]])])
    yield dict(os.environ)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class _Text(HTMLParser):
    """The visible text of a page (no script, style or title)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._skip += tag in ("script", "style", "title")

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("script", "style", "title")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


@pytest.mark.slow
def test_an_executed_notebook_exports_the_first_failure(tmp_path, kernel_env) -> None:
    import nbclient
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    # saved as JupyterLab saves by default: without the widgets' state, which only a kernel
    # (or an embedding with network access) could draw
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=240,
                                     store_widget_state=False,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    assert "FIRST 2 50" in nb.cells[2].outputs[0]["text"]
    outputs = [o for o in nb.cells[1].outputs if "data" in o]
    assert [WIDGET in o["data"] for o in outputs] == [True, False], nb.cells[1].outputs
    data = outputs[1]["data"]  # the diagnosis, after the panel, as the cell ended
    assert "First failure: step 50, layer 2" in data["text/html"]
    assert "first failure" in data["text/plain"] and "is running" not in data["text/plain"]
    path = tmp_path / "diagnosed.ipynb"
    nbformat.write(nb, path)

    done = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html",
                           str(path)], check=False, capture_output=True, text=True,
                          env=kernel_env, timeout=120)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "diagnosed.html").read_text(encoding="utf-8")
    parser = _Text()
    parser.feed(page)
    text = " ".join(" ".join(parser.parts).split())
    assert text.count("First failure: step 50, layer 2") == 1, text  # once, not twice
    assert not re.search(r"<\S+ object at 0x[0-9a-f]+>", text), "a repr instead of the diagnosis"


def test_show_opens_a_saved_runs_panel_with_clicks_and_sliders(tmp_path) -> None:
    run, layer = _broken()
    saved = run.save(tmp_path / "run.npz")
    assert ndbg.show(saved) is None  # shown once: nothing more for a cell's last line to show
    panel = shown_panel()
    try:
        assert panel.status == "finished"
        assert (panel.first_failure["layer"], panel.first_failure["step"]) == (layer, S)
        assert panel.map_values  # the tooltip numbers of a finished run
        panel.selected = {"layer": layer, "step": S}  # a click on the first failure
        assert "grad_norm" in panel.inspector_html
        before = list(panel.run.events)
        panel.thresholds = {**panel.thresholds, "jump": panel.thresholds["jump"] * 100}
        assert panel.run is not run and panel.run.events != before  # re-classified
    finally:
        panel.close()
    with pytest.raises(FileNotFoundError, match="no saved run"):
        ndbg.show(tmp_path / "missing.npz")


@pytest.mark.browser
def test_jupyterlab_shows_the_panel_alone_then_the_diagnosis_after_a_restart(tmp_path) -> None:
    """In JupyterLab with Chromium: while the kernel lives the diagnosis output is hidden
    under the live panel; saved, the kernel shut down and the page reloaded, the panel's
    widget is gone and the diagnosis shows, naming the first failure."""
    from _jupyter import LAB, launch_server, missing_requirements

    chromium = os.environ.get("NDBG_CHROMIUM", "/usr/bin/chromium")
    missing = missing_requirements(LAB)
    if missing or not os.access(chromium, os.X_OK):
        pytest.fail(f"the browser test needs: {missing or chromium}", pytrace=False)
    import nbformat
    from playwright.sync_api import expect, sync_playwright

    server = launch_server(tmp_path)
    try:
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS[:2]]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        nbformat.write(nb, server.root / "restart.ipynb")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])
            try:
                server.wait_until_serving(60)
                page = browser.new_page(viewport={"width": 1280, "height": 1600})
                page.goto(server.url("restart.ipynb", LAB))
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
                page.wait_for_selector(LAB.kernel_ready[0], timeout=120_000)
                for i in range(2):
                    cell = page.locator(".jp-Notebook .jp-Cell").nth(i)
                    cell.locator(".jp-InputArea-editor").click()
                    page.keyboard.press("Escape")
                    page.keyboard.press("Shift+Enter")
                    expect(cell.locator(".jp-InputArea-prompt")).to_have_text(
                        re.compile(r"\[\d+\]:"), timeout=180_000)
                panel = page.locator(".ndbg-panel")
                expect(panel).to_have_attribute("data-status", "finished", timeout=30_000)
                static = page.locator(".ndbg-static")
                expect(static).to_have_count(1)
                expect(static).to_be_hidden()  # the live panel alone
                page.keyboard.press("Control+s")
                page.wait_for_function("() => !document.title.startsWith('*')", timeout=10_000)
                time.sleep(1)  # the save's request reaches the server
                server.shut_down_sessions()
                page.reload()
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
                expect(static).to_be_visible(timeout=60_000)
                assert page.locator(".ndbg-panel").count() == 0
                text = " ".join(static.inner_text().split())
                page.screenshot(path=str(tmp_path / "after-restart.png"), full_page=True)
            finally:
                browser.close()
    finally:
        server.stop()
    assert "First failure: step 50, layer 2" in text
