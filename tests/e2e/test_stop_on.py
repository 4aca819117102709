"""`stop_on="error"`: the training stops at the step of the first failure (before that
step's update, or one step later for a bad update, which can only be judged after it),
and leaves no hook behind; without it a run trains on to the end."""

from __future__ import annotations

import pytest
import torch
from conftest import leftover_global_hooks, leftover_module_hooks
from faults import STEPS, S, lr_x1e4, nan_input, run_with_fault
from models import FACTORIES, train, weight_of

import neuraldbg_nb as ndbg


def _assert_unhooked(model: torch.nn.Module) -> None:
    assert leftover_global_hooks() == []
    assert leftover_module_hooks(model) == []


def test_stop_on_error_raises_at_the_failure_step_before_the_update():
    setup = FACTORIES["mlp"]()
    layer = setup.layers["mid"]
    snapshot: dict[str, torch.Tensor] = {}

    def hit(step, model, opt):
        if step == S:
            with torch.no_grad():
                weight_of(model, layer).mul_(1000.0)
            snapshot.update({k: v.clone() for k, v in model.state_dict().items()})

    with pytest.raises(ndbg.TrainingFailure) as info, \
            ndbg.watch(setup.model, stop_on="error", report=False):
        train(setup, STEPS, on_step_start=hit)
    run = info.value.run
    assert isinstance(info.value, RuntimeError)
    assert run.status == "stopped"
    # raised from the optimizer pre-step hook of step S: the step is recorded ...
    assert run.trace.n_steps == S + 1
    assert run.first_failure is not None
    assert (run.first_failure.step, run.first_failure.layer) == (S, layer)
    assert f"step {S}" in str(info.value)
    # ... and the update of step S never happened: training stopped at the cause
    for k, v in setup.model.state_dict().items():
        assert torch.equal(v, snapshot[k]), f"{k} changed after the stop"
    assert ndbg.last_run() is run
    _assert_unhooked(setup.model)


def test_stop_on_error_for_a_bad_update_raises_one_step_later():
    """An update can only be judged after it happened: the exploding update of step S is
    seen at the next step boundary, so the trace has S+2 steps, the root is still step S."""
    setup = FACTORIES["mlp"]()
    with pytest.raises(ndbg.TrainingFailure) as info, \
            ndbg.watch(setup.model, stop_on="error", report=False):
        train(setup, STEPS, **lr_x1e4(setup, None))
    run = info.value.run
    assert run.trace.n_steps == S + 2
    ff = run.first_failure
    assert (ff.step, ff.layer, ff.kind) == (S, setup.layers["first"], "exploding_update")
    _assert_unhooked(setup.model)


def test_stop_on_error_for_bad_data():
    setup = FACTORIES["cnn"]()
    with pytest.raises(ndbg.TrainingFailure) as info, \
            ndbg.watch(setup.model, stop_on="error", report=False):
        train(setup, STEPS, **nan_input(setup, None))
    run = info.value.run
    assert run.trace.n_steps == S + 1
    ff = run.first_failure
    assert (ff.step, ff.layer, ff.kind) == (S, None, "data_anomaly")
    assert all(e.step == S for e in run.events if e.severity == "error")
    _assert_unhooked(setup.model)


def test_stop_on_never_trains_through_a_nan():
    _, run = run_with_fault("cnn", nan_input, None)
    assert run.status == "finished"
    assert run.trace.n_steps == STEPS
    assert run.first_failure.step == S
