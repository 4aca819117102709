"""The end of a run and the causal order inside a step, in real trainings: a fault at the
last optimizer step is found at that step; an update that explodes because the same
step's gradient did, at a learning rate that did not move, is explained as the gradient's
failure, with the initialisation named where the gradients grow by a steady factor per
layer toward the input from step 0."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from loops import assert_no_errors, watched_sgd
from models import mlp
from torch import nn

import neuraldbg_nb as ndbg

STEPS = 60


def _last_step_fault(fault: str | None) -> ndbg.Run:
    setup = mlp()
    model = setup.model
    opt = setup.make_opt(model)
    last = STEPS - 1
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            x, y = setup.batch(step)
            if step == last and fault == "weights_x1000":
                with torch.no_grad():
                    model[2].weight.mul_(1000)
            loss = F.cross_entropy(model(x), y)
            if step == last and fault == "nan_loss":
                loss = loss * float("nan")
            opt.zero_grad()
            loss.backward()
            if step == last and fault == "nan_grad":
                model[2].weight.grad[0, 0] = float("nan")
            opt.step()
    return run


@pytest.mark.parametrize("fault, expected", [
    ("weights_x1000", ("regime_shift", "activation", "2")),
    ("nan_grad", ("nonfinite_gradient", "gradient", "2")),
    ("nan_loss", ("loss_nonfinite", "loss", None)),
])
def test_a_fault_at_the_last_optimizer_step_is_found_there(fault, expected):
    run = _last_step_fault(fault)
    ff = run.first_failure
    assert ff is not None, run.events
    assert (ff.kind, ff.signal, ff.layer, ff.step) == (*expected, STEPS - 1), ff


def test_the_same_training_without_a_fault_ends_quiet():
    run = _last_step_fault(None)
    assert_no_errors(run)
    assert run.first_failure is None


def _deep_tanh(gain: float, depth: int = 20, width: int = 64) -> nn.Module:
    """A deep tanh MLP whose weights have std gain / sqrt(fan_in): at 4, each layer
    amplifies the backward signal about 1.5x (the chaotic phase of a tanh network), at 1
    it keeps it."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    d = 20
    for _ in range(depth):
        lin = nn.Linear(d, width)
        nn.init.normal_(lin.weight, std=gain / math.sqrt(d))
        nn.init.zeros_(lin.bias)
        layers += [lin, nn.Tanh()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, 4))


def _train_deep(gain: float) -> ndbg.Run:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 20, generator=g)
    y = x[:, :4].argmax(1)
    return watched_sgd(_deep_tanh(gain), x, y, STEPS, 0.05)[0]


def test_an_update_that_applied_an_init_grown_gradient_is_the_gradients_failure():
    run = _train_deep(4.0)
    ff = run.first_failure
    assert (ff.kind, ff.layer, ff.step) == ("exploding_update", "0", 0), ff
    causes = run.likely_causes
    assert [c.kind for c in causes] == ["gradient", "init"], causes
    assert "at a learning rate that did not move (0.05): the gradient exploded" in causes[0].text
    init = causes[1]
    assert 1.4 < init.value < 1.7, init
    assert init.text.startswith("gradients grow about 1.5x per layer toward the input from "
                                "step 0 (")
    assert "initialisation; use a smaller init" in init.text
    assert str(init) in str(run)  # the story says it next to the first failure


def test_the_same_network_at_a_unit_gain_has_no_such_cause():
    run = _train_deep(1.0)
    assert_no_errors(run)
    assert run.likely_causes == []


def _edited_at_30(**watch_kw) -> ndbg.Run:
    """Layer "2"'s weights multiplied by 1000 in place before step 30's forward."""
    setup = mlp()
    model = setup.model
    opt = setup.make_opt(model)
    try:
        with ndbg.watch(model, report=False, **watch_kw) as run:
            for step in range(STEPS):
                if step == 30:
                    with torch.no_grad():
                        model[2].weight.mul_(1000)
                x, y = setup.batch(step)
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
    except ndbg.TrainingFailure:
        assert watch_kw.get("stop_on") == "error"
    return run


@pytest.mark.parametrize("stop_on", ["never", "error"])
def test_weights_edited_before_the_forward_rank_first_without_activations(stop_on):
    """With no activations watched, the edit is read as step 30's update begins: the
    first failure at its own step and layer, before the loss it blows up, also where the
    run stops at its first failure."""
    run = _edited_at_30(activations=False, stop_on=stop_on)
    ff = run.first_failure
    assert ff is not None, run.events
    assert (ff.kind, ff.signal, ff.layer, ff.step) == ("exploding_update", "edited", "2", 30), ff
    assert "945x their size" in ff.message and "changed outside the optimizer" in ff.message
    if stop_on == "never":  # the update that carried it is not said a second time
        late = [e for e in run.events if e.kind == "exploding_update" and e.layer == "2"
                and e.step == 30 and e is not ff]
        assert late == [], late
    else:
        assert run.status == "stopped" and run.trace.n_steps == 31


@pytest.mark.parametrize("stop_on", ["never", "error"])
def test_with_activations_the_edit_is_the_likely_cause_also_when_the_run_stops(stop_on):
    run = _edited_at_30(stop_on=stop_on)
    ff = run.first_failure
    assert (ff.kind, ff.signal, ff.layer, ff.step) == ("regime_shift", "activation", "2", 30), ff
    assert any(c.kind == "edited" and c.layer == "2" and c.step == 30
               for c in run.likely_causes), run.likely_causes
