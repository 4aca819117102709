"""The errors a user gets for a wrong argument to `watch()` or a misspelt threshold: a
type error that names the fix, a spelling hint."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import leftover_global_hooks
from models import mlp, train
from torch import nn

import neuraldbg_nb as ndbg


def test_watch_of_a_string_is_a_type_error_naming_the_fix():
    with pytest.raises(TypeError) as info:
        ndbg.watch("not a model")
    msg = str(info.value)
    assert "nn.Module" in msg and "got str for 'model'" in msg  # (not its first letter)
    assert "Pass the model" in msg
    assert leftover_global_hooks() == []


def test_watch_of_parameters_or_an_output_is_a_type_error():
    model = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="parameters"):
        ndbg.watch(model.parameters())
    with pytest.raises(TypeError, match="output"):
        ndbg.watch(model(torch.randn(4, 3)))
    assert leftover_global_hooks() == []


def test_unknown_threshold_names_get_a_spelling_hint():
    model = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="Did you mean 'vanish'"):
        ndbg.watch(model, vanihs=1e-7)
    with pytest.raises(TypeError, match="Did you mean 'jump_error'"):
        ndbg.Thresholds().with_(jump_eror=50)
    with pytest.raises(ValueError, match="stop_on"):
        ndbg.watch(model, stop_on="errors")
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 5)
    with pytest.raises(TypeError, match="Did you mean 'window'"):
        run.reclassify(windw=5)
    assert leftover_global_hooks() == []


def test_a_whole_number_given_as_a_float_is_a_count_and_other_kinds_are_refused():
    """`window=20.0` (a slider's value, a config file's) is the count 20; 2.5 steps, a
    string or a bool is refused when the watch is made, not by its own code later."""
    assert ndbg.Thresholds(window=20.0, patience=3.0).window == 20
    assert type(ndbg.Thresholds(patience=3.0).patience) is int
    assert type(ndbg.Thresholds(jump=20).jump) is float
    model = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="whole number"):
        ndbg.watch(model, window=2.5)
    with pytest.raises(TypeError, match="Thresholds.jump is a number"):
        ndbg.watch(model, jump="abc")
    with pytest.raises(TypeError, match="Thresholds.window is a number"):
        ndbg.watch(model, window=True)
    with pytest.raises(ValueError, match="sample_every is a whole number"):
        ndbg.watch(model, sample_every=2.5)
    with pytest.raises(TypeError, match="sample_every is a number"):
        ndbg.watch(model, sample_every="10")
    assert ndbg.watch(model, sample_every=5.0).options.sample_every == 5
    setup = mlp()
    with ndbg.watch(setup.model, report=False, window=20.0) as run:
        train(setup, 30)
    assert run.status == "finished" and not run.notes, run.notes
    with pytest.raises(ValueError, match="whole number"):
        run.reclassify(window=2.5)


def test_a_block_that_only_evaluates_reads_no_gradient_left_from_before():
    """A forward-only block after training outside it (the gradients of the last step
    left in `.grad`, here NaN): no backward ran, so no gradient is this block's."""
    setup = mlp()
    train(setup, 3)
    for p in setup.model.parameters():
        p.grad.fill_(float("nan"))
    with ndbg.watch(setup.model, report=False) as run:
        for step in range(3):
            setup.model(setup.batch(step)[0])
    assert run.first_failure is None, [str(e) for e in run.events]
    assert np.isnan(run.trace.col("grad_norm")).all()
