"""The panel's Python side: its state, its message sizes, the sliders, the inspector."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.live.captures import CaptureStore
from neuraldbg_nb.notebook import panel_state
from neuraldbg_nb.notebook.panel import MAX_RATE, Panel
from neuraldbg_nb.report.run import Run
from neuraldbg_nb.trace import Trace

FAULT_LAYER, FAULT_STEP = "2", 50


def broken_run(steps: int = 90) -> Run:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(steps * 32, 16, generator=g), torch.randint(0, 4, (steps * 32,), generator=g)
    with ndbg.watch(model, report=False) as run:
        for step in range(steps):
            if step == FAULT_STEP:
                with torch.no_grad():
                    model[2].weight.mul_(1000)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[step * 32:(step + 1) * 32]),
                                        y[step * 32:(step + 1) * 32]).backward()
            opt.step()
    return run


def synthetic_run(steps: int, layers: int, jump_at: tuple[int, int] | None = None) -> Run:
    """A recorded trace made by hand: healthy noise, optionally one 1000x activation jump."""
    rng = np.random.default_rng(0)
    t = Trace()
    for j in range(layers):
        t.add_layer(f"block.{j}.fc", "Linear", "other", True)
    grads = 10 ** rng.normal(-1, 0.1, (steps, layers))
    acts = 10 ** rng.normal(0, 0.1, (steps, layers))
    if jump_at is not None:
        layer, step = jump_at
        acts[step:, layer:] *= 1000
    for s in range(steps):
        t.append({"grad_norm": grads[s], "act_absmax": acts[s]}, {"loss": 1.0})
    return Run(t, ndbg.Thresholds(), CaptureStore(0))


def test_state_after_a_run_names_the_failure_on_the_map() -> None:
    run = broken_run()
    panel = Panel(run)
    assert panel.status == "finished" and panel.step == 90
    assert panel.layers == run.trace.layer_names
    cols = panel.map_cols
    cells = np.frombuffer(panel.map, np.uint8).reshape(len(panel.layers), cols)
    row = panel.layers.index(FAULT_LAYER)
    col = FAULT_STEP * cols // 90
    assert cells[row, col] == 3, "the fault's cell is not an error"
    assert (cells[:, : col] <= 2).all(), "errors before the fault"
    assert panel.first_failure["layer"] == FAULT_LAYER
    assert panel.first_failure["step"] == FAULT_STEP
    values = np.frombuffer(panel.map_values, "<f4").reshape(len(panel.layers), cols)
    assert np.isfinite(values[row, :col]).all()
    root = panel.first_failure["id"]
    assert any(e["symptom_of"] == root for e in panel.events)
    # the header says what watching cost, measured while it trained
    # and, the run being over, what the whole run cost, its start and end included
    assert re.fullmatch(r"watching \+\d+\.\d ms/step \(\+\d+\.\d%; the whole run \+\d+\.\d%\)",
                        panel.cost), panel.cost
    assert "ms a step" in panel.cost_detail and "over the whole run" in panel.cost_detail
    assert "overhead budget" not in panel.cost_detail  # no budget, no note


def test_live_messages_stay_small_however_long_the_run() -> None:
    for steps in (1_000, 10_000):
        run = synthetic_run(steps, 100, jump_at=(40, steps // 2))
        run.status = "training"
        state = panel_state.panel_state(run, with_values=False)
        size = sum(len(v) if isinstance(v, bytes) else len(json.dumps(v))
                   for k, v in state.items() if k != "layers")  # names go once
        assert size < 64_000, f"{steps} steps: a live update is {size} bytes"


@pytest.mark.timed
def test_updates_are_throttled_while_training() -> None:
    pushes = []
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    import time

    with ndbg.watch(model, report=False) as run:
        panel = Panel(run)
        panel.observe(lambda change: pushes.append(change["new"]), names="step")
        started = time.monotonic()
        for _ in range(1500):
            opt.zero_grad()
            model(torch.ones(4, 8)).sum().backward()
            opt.step()
        elapsed = time.monotonic() - started
    assert run.trace.n_steps == 1500
    assert len(pushes) <= elapsed * MAX_RATE + 2, (len(pushes), elapsed)
    assert pushes[-1] == 1500  # the final state is always sent
    assert len(run._baselines) > 0, "the sliders' baselines should be ready when training ends"


def test_slider_move_reclassifies_without_training() -> None:
    run = broken_run()
    panel = Panel(run)
    before = panel.first_failure
    assert before["kind"] == "regime_shift"
    panel.thresholds = {**panel.thresholds, "jump": 5000.0}
    assert panel.run is not run and panel.run.trace is run.trace
    assert panel.run.thresholds.jump == 5000
    assert panel.first_failure != before
    assert not any(e["kind"] == "regime_shift" and e["severity"] == "error" for e in panel.events)
    assert "re-classified" in panel.message
    panel.thresholds = {**panel.thresholds, "jump": 10.0}  # back: the same answer as live
    assert panel.first_failure == before


def test_bad_slider_value_is_reported_not_raised() -> None:
    panel = Panel(broken_run(60))
    panel.thresholds = {**panel.thresholds, "vanish": 1e9}  # above explode
    assert "not applied" in panel.message


def test_click_opens_the_inspector_with_charts_and_the_tensors() -> None:
    run = broken_run()
    panel = Panel(run)
    panel.selected = {"layer": FAULT_LAYER, "step": FAULT_STEP}
    html = panel.inspector_html
    assert "<svg" in html, "no chart rendered"
    assert re.search(r"ndbg\.runs\[\d+\]\.selected\.tensors", html), "no hint naming this run"
    assert run.selected is not None and run.selected.step == FAULT_STEP
    out = run.selected.tensors["output"]
    assert out.shape == (32, 64) and out.abs().max() > 100


def test_inspector_offers_the_nearest_capture() -> None:
    run = broken_run()
    panel = Panel(run)
    panel.selected = {"layer": "0", "step": 33}
    assert "nearest capture" in panel.inspector_html


@pytest.mark.parametrize("layers", [1, 1000])
def test_map_shape_is_bounded(layers: int) -> None:
    cols = panel_state.map_shape(100_000, layers)
    assert 1 <= cols <= panel_state.MAX_COLS and cols * layers <= max(panel_state.MAX_CELLS, 8 * layers)


def test_long_run_is_compacted_within_its_budget_and_keeps_its_events() -> None:
    """A run far longer than the trace budget: memory stays bounded, the fault's event is
    still exact, and the panel still draws the whole run."""
    from neuraldbg_nb.live.watcher import Watch

    w = Watch(None, report=False, trace_mb=1)
    t = w.run.trace
    for j in range(20):
        t.add_layer(f"l{j}", "Linear", "other", True)
    rng = np.random.default_rng(0)
    steps, fault = 30_000, 20_000
    for s in range(steps):
        acts = (10 ** rng.normal(0, 0.05, 20)).astype(np.float32)
        if s >= fault:
            acts[12:] *= 1000
        t.append({"grad_norm": np.full(20, 0.1, np.float32), "act_absmax": acts}, {"loss": 1.0})
        w._bound_trace()
    assert t.full_from > fault, "the fault's steps should have been compacted"
    assert t.tail_nbytes <= 2**20
    assert t.nbytes <= 1.5 * 2**20 + t.row_nbytes
    # the tail's arrays grow by doubling, but never far past the budget
    assert t.allocated_nbytes <= 1.5 * 2**20 + 4 * t.row_nbytes
    w.run.status = "finished"
    ff = w.run.first_failure
    assert (ff.layer, ff.step, ff.kind) == ("l12", fault, "regime_shift")
    cells = np.frombuffer(panel_state.panel_state(w.run, True)["map"], np.uint8).reshape(20, -1)
    col = fault * cells.shape[1] // steps
    assert cells[12, col] == 3 and (cells[:12] <= 1).all()
    assert w.run.reclassify(jump=20).first_failure.step == fault  # kept from the live run
