"""The errors a user gets for a wrong argument to `watch()` or a misspelt threshold: a
type error that names the fix, a spelling hint."""

from __future__ import annotations

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
    assert "nn.Module" in msg and "str" in msg
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
