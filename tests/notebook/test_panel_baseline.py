"""The panel's baseline run and its answers to the browser, on real short trainings: a
broken run shown beside a healthy run of the same recipe carries where they part (the step
and layer of the injected fault, the comparison's sentence, the events only the broken run
has); two healthy runs of other seeds do not part; each request from the browser (a click,
a slider) is acknowledged, whatever came of it."""

from __future__ import annotations

import pytest
from faults import STEPS, S, weight_x1000
from models import mlp, train
from panels import shown_panel

import neuraldbg_nb as ndbg
from neuraldbg_nb.notebook import panel_state
from neuraldbg_nb.notebook.panel import Panel


def _run(seed: int = 0, fault=None) -> ndbg.Run:
    setup = mlp(seed)
    kw = fault(setup, setup.layers["mid"]) if fault else {}
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, **kw)
    return run


@pytest.fixture(scope="module")
def runs() -> dict[str, ndbg.Run]:
    return {"healthy": _run(), "other_seed": _run(seed=1), "broken": _run(fault=weight_x1000)}


def test_the_panel_state_carries_where_a_broken_run_parts_from_its_baseline(runs) -> None:
    layer = mlp().layers["mid"]
    state = panel_state.baseline(runs["broken"], runs["healthy"], "yesterday.npz")
    assert (state["step"], state["layer"]) == (S, layer), state
    assert state["row"] == runs["broken"].trace.layer_names.index(layer)
    assert state["name"] == "yesterday.npz"
    assert f"part at step {S}, layer {layer}" in state["sentence"]
    assert "\n" not in state["sentence"]
    assert state["only_run"] and not state["only_baseline"], state
    assert all(e["severity"] in ("warning", "error") for e in state["only_run"])
    assert any(e["step"] >= S for e in state["only_run"])
    # the same facts as `compare`, baseline first
    c = ndbg.compare(runs["healthy"], runs["broken"])
    assert c.parting is not None and (c.parting.step, c.parting.layer) == (S, layer)


def test_healthy_runs_of_other_seeds_do_not_part_in_the_panel(runs) -> None:
    state = panel_state.baseline(runs["other_seed"], runs["healthy"])
    assert state["step"] is None and state["layer"] is None and state["row"] == -1, state
    assert "do not part" in state["sentence"]
    assert not state["only_run"] and not state["only_baseline"]


def test_the_panel_sends_the_baseline_once_the_run_is_over(runs) -> None:
    panel = Panel(runs["broken"], baseline=runs["healthy"], baseline_name="healthy.npz")
    try:
        assert panel.baseline is not None
        assert (panel.baseline["step"], panel.baseline["name"]) == (S, "healthy.npz")
    finally:
        panel.close()
    plain = Panel(runs["broken"])
    try:
        assert plain.baseline is None
    finally:
        plain.close()


def test_show_takes_a_saved_baseline(runs, tmp_path) -> None:
    path = runs["healthy"].save(tmp_path / "yesterday.npz")
    ndbg.show(runs["broken"], baseline=path)
    panel = shown_panel()
    try:
        assert panel.baseline["name"] == "yesterday.npz"
        assert panel.baseline["step"] == S
    finally:
        panel.close()


def test_every_request_from_the_browser_is_answered(runs) -> None:
    panel = Panel(runs["broken"])
    sent: list[dict] = []
    panel.send = sent.append  # what reaches the browser over the widget's comm
    try:
        root = runs["broken"].first_failure
        assert root is not None
        panel.selected = {"layer": root.layer, "step": root.step}
        assert panel.inspector_html and sent[-1] == {"answer": "selected"}
        # new thresholds: re-classified and answered
        before = panel_state.thresholds(panel.run)
        panel.thresholds = {**before, "explode": before["explode"] * 10}
        assert panel.run.thresholds.explode == before["explode"] * 10
        assert sent[-1] == {"answer": "thresholds"}
        # thresholds equal to the run's: nothing to do, still answered
        n = len(sent)
        panel.thresholds = {}
        panel.thresholds = dict(panel_state.thresholds(panel.run))
        assert sent[n:] == [{"answer": "thresholds"}] * 2
        # a bad value: said in the message, and answered
        panel.thresholds = {**panel_state.thresholds(panel.run), "dead": "x"}
        assert panel.message.startswith("thresholds not applied")
        assert sent[-1] == {"answer": "thresholds"}
    finally:
        panel.close()


def test_the_static_copy_of_a_comparison_says_where_they_part(runs) -> None:
    import html

    from neuraldbg_nb.notebook.static import diagnosis_bundle

    sentence = panel_state.baseline(runs["broken"], runs["healthy"], "yesterday.npz")["sentence"]
    assert sentence.startswith("yesterday.npz vs this run")
    bundle = diagnosis_bundle(runs["broken"], sentence)
    assert sentence in bundle["text/plain"]
    page = bundle["text/html"]
    # inside the diagnosis' own box, which the live panel hides while it lives
    assert page.index("class='ndbg-static'") < page.index(html.escape(sentence))
    assert page.rstrip().endswith("</div>")
    assert sentence not in diagnosis_bundle(runs["broken"])["text/plain"]
