"""One home for what the panel and its static copies both say, checked on real short
trainings: the colors of the states and severities (`report/palette.json`, which the live
panel's `js/colors.ts` reads too), the words for a run that watched nothing
(`report.story.watched_nothing`), and a layer's recorded numbers at a step
(`report.page.layer_numbers`, which the inspector shows)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from faults import STEPS, S, weight_x1000
from models import mlp, train
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.notebook import inspector, panel_state
from neuraldbg_nb.notebook.static import diagnosis_bundle
from neuraldbg_nb.report import page, story
from neuraldbg_nb.report.static import diagnosis_html, health_svg

ROOT = Path(__file__).resolve().parents[2]
PALETTE = json.loads((ROOT / "neuraldbg_nb" / "report" / "palette.json").read_text())
COLORS_TS = (ROOT / "js" / "colors.ts").read_text()
HEX = re.compile(r"#[0-9a-fA-F]{6}\b")


def _broken() -> ndbg.Run:
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, **weight_x1000(setup, setup.layers["mid"]))
    return run


def test_the_panel_reads_its_colors_from_the_palette_file() -> None:
    assert "palette.json" in COLORS_TS
    assert not HEX.search(COLORS_TS), "js/colors.ts repeats a color of palette.json"


def test_the_static_copy_and_the_report_draw_the_panels_colors() -> None:
    run = _broken()
    assert run.first_failure is not None and run.first_failure.step == S
    light = PALETTE["light"]
    allowed = {c.lower() for c in light["states"] + [light["info"]]}
    error = light["states"][3].lower()
    fragment = diagnosis_html(run)
    # the first failure's line is in the error color, and the map's error cells too
    assert f"color:{error}" in fragment.lower()
    assert f'fill="{error}"' in health_svg(run).lower()
    report = page.page(run)
    assert error in report.lower()
    # every color that means a state or a severity is the palette's; the rest are greys,
    # the ink and the loss line
    neutral = {"#000", "#555", "#777", "#ccc", "#222", "#fff", "#e3e3e3", "#4c78a8"}
    for text in (fragment, report):
        for hex_ in HEX.findall(text):
            assert hex_.lower() in allowed | neutral, f"{hex_} is no color of palette.json"


def test_a_run_that_watched_nothing_is_told_in_one_set_of_words() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with ndbg.watch(model, report=False) as run:
        pass  # a cell that trains nothing
    why = story.watched_nothing(run)
    assert why is not None and why.startswith("nothing was watched")
    assert why in story.headline(run)
    assert why in panel_state.panel_state(run, with_values=True)["notes"]
    assert why in diagnosis_bundle(run)["text/plain"]


def test_the_inspector_shows_the_layers_recorded_numbers() -> None:
    run = _broken()
    names = run.trace.layer_names
    layer = mlp().layers["mid"]
    numbers = page.layer_numbers(run, names.index(layer), S)
    assert "grad_norm" in numbers and numbers["grad_norm"][1] == S
    html = inspector.inspector_html(run, layer, S)
    assert "ndbg-insp-numbers" in html
    assert not hasattr(inspector, "numbers"), "a second home of the layer's numbers"
