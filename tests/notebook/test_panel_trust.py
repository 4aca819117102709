"""What the panel's Python side tells a user, checked on real short trainings: charts that
draw zeros and non-finite values and span the whole run, a hint per run, the inspector made
before the click, runs that watched nothing or were interrupted named as such, and sliders
only for the settings that judge something in this run."""

from __future__ import annotations

import re
import time

import pytest
import torch
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.notebook import inspector, panel_state
from neuraldbg_nb.report import story

STEPS, FAULT = 40, 25


def _train(model: nn.Module, fault=None, steps: int = STEPS) -> ndbg.Run:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(steps * 16, 8, generator=g), torch.randint(0, 4, (steps * 16,), generator=g)
    with ndbg.watch(model, report=False) as run:
        for step in range(steps):
            if fault is not None and step == FAULT:
                fault(model)
            opt.zero_grad()
            out = model(x[step * 16:(step + 1) * 16])
            nn.functional.cross_entropy(out, y[step * 16:(step + 1) * 16]).backward()
            opt.step()
    return run


def _kill_relu(model: nn.Module) -> None:
    """Every unit of ReLU "1" dead from FAULT on: its output is exactly 0."""
    with torch.no_grad():
        model[0].bias.fill_(-1e4)


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_dead_layers_zeros_are_drawn_and_named_not_dropped() -> None:
    run = _train(_mlp(), _kill_relu)
    html = inspector.inspector_html(run, "1", FAULT + 2)
    # the activation charts of the dead ReLU: the zeros of the steps measured from FAULT
    # on (those whose layer hooks were on) are on the chart
    measured = int((run.trace.scalar("hooked")[FAULT:] == 1).sum())
    zeros = [int(n) for n in re.findall(r"exactly 0 at (\d+) step", html)]
    assert measured >= 3 and zeros and max(zeros) >= measured - 1, (zeros, measured)
    # the x-axis spans the run, not only the steps with a drawable value
    assert f"values from 0 to {STEPS - 1}" in html or f"0 to {STEPS - 1}" in html, \
        re.findall(r"X-axis[^\"]*", html)[:3]


def test_a_healthy_layer_has_no_zero_or_nonfinite_notes() -> None:
    run = _train(_mlp())
    html = inspector.inspector_html(run, "2", 10)
    assert "exactly 0" not in html and "non-finite at" not in html


def test_non_finite_values_are_marked_on_the_chart() -> None:
    def nan_weights(model: nn.Module) -> None:
        with torch.no_grad():
            model[2].weight.fill_(float("inf"))

    run = _train(_mlp(), nan_weights)
    html = inspector.inspector_html(run, "2", FAULT)
    assert "non-finite at" in html, "the inf activations are not on the chart"


@pytest.mark.timed
def test_each_run_has_its_own_hint_and_its_inspector_is_made_before_the_click() -> None:
    first = _train(_mlp(), _kill_relu)
    second = _train(_mlp(), _kill_relu)
    a, b = panel_state.handle(first), panel_state.handle(second)
    assert a != b and ndbg.runs[int(a[10:-1])] is first and ndbg.runs[int(b[10:-1])] is second
    assert f"{b}.selected.tensors" in inspector.inspector_html(second, "1", FAULT)

    run = _train(_mlp(), _kill_relu)
    inspector.warm_up()
    inspector.prepare(run)
    assert run.selected is None, "making the inspector ahead selected something"
    root = run.first_failure
    assert root is not None
    started = time.perf_counter()
    html = inspector.inspector_html(run, root.layer, root.step)
    assert time.perf_counter() - started < 0.05, "the first failure's inspector was not ready"
    assert "<svg" in html and run.selected is not None and run.selected.step == root.step


def test_a_cell_that_trains_nothing_says_so() -> None:
    with ndbg.watch(_mlp(), report=False) as run:
        pass
    state = panel_state.panel_state(run, with_values=True)
    assert any("nothing was watched" in n for n in state["notes"]), state["notes"]
    assert state["sliders"] == [], "sliders that could decide nothing"

    healthy = _train(_mlp())
    assert story.watched_nothing(healthy) is None


def test_an_interrupted_run_reads_interrupted() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(KeyboardInterrupt), ndbg.watch(model, report=False) as run:
        for step in range(10):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            if step == 5:
                raise KeyboardInterrupt
    assert panel_state.panel_state(run, with_values=True)["status"] == "interrupted"


def test_sliders_only_for_settings_that_judge_this_run() -> None:
    relu = {s["key"] for s in panel_state.sliders(_train(_mlp()))}
    assert {"vanish", "explode", "jump", "dead", "max_update"} <= relu
    assert "saturated" not in relu  # no bounded activation here
    torch.manual_seed(0)
    tanh = {s["key"] for s in panel_state.sliders(
        _train(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))))}
    assert "saturated" in tanh and "dead" not in tanh
