"""The whole model stopped learning (`weights_not_updated`, signal `model`) on hand-made
traces: every layer with a gradient left exactly as it was by its updates is an error and
the first failure, dated as its layers are: from the step the learning rate fell below
`TOO_SMALL`, where it did (the updates are read on sampled steps, the learning rate on
every step); one layer of several is a warning of its own."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, live_scan, noisy, of, same

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect, first_failure

LAYERS = [("fc0", "other"), ("fc1", "other"), ("fc2", "other")]


def _stalled(from_step: int, which: list[int], lr: np.ndarray | None = None):
    g = noisy(0.1, cols=3)
    upd = np.full((N, 3), np.nan)
    upd[::10] = 1e-3
    w = 5.0 + np.cumsum(np.full((N, 3), 1e-3), 0)
    for i in which:
        upd[from_step + 1::10, i] = 0.0
        w[from_step:, i] = w[from_step, i]
    scalars = {"loss": np.ones(N), "lr": np.full(N, 1e-3) if lr is None else lr}
    return {"grad_norm": g, "update_ratio": upd, "param_norm": w}, scalars


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_every_layer_stalled_is_the_whole_model_an_error_and_the_first_failure(chunk):
    lr = np.where(np.arange(N) < 30, 1e-3, 1e-12)
    cols, scalars = _stalled(29, [0, 1, 2], lr)  # the update of step 30 is the first still
    _, events = detect(build(LAYERS, cols, scalars))
    (model,) = of(events, "weights_not_updated", None, "model")
    assert (model.step, model.severity, model.value) == (30, "error", 3.0)  # seen at 40
    assert "whole model stopped learning from step 30" in model.message
    assert "learning rate is 1e-12 since step 30" in model.message
    assert first_failure(events, ndbg.Thresholds()) is model
    layers = of(events, "weights_not_updated", "any", "update")
    assert [e.step for e in layers] == [30, 30, 30]
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_one_layer_of_several_stalled_is_a_warning_and_not_the_whole_model():
    cols, scalars = _stalled(29, [1])
    _, events = detect(build(LAYERS, cols, scalars))
    assert not of(events, "weights_not_updated", None, "model")
    (one,) = of(events, "weights_not_updated")
    assert (one.layer, one.severity) == ("fc1", "warning")
    assert first_failure(events, ndbg.Thresholds()) is None


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_stall_at_an_ordinary_learning_rate_is_dated_where_it_was_seen(chunk):
    """Updates that stop at a learning rate that still moves weights (a layer left out of
    the optimizer) have nothing to date them between two samples: the sampled step that
    saw it, and not where the learning rate last changed."""
    lr = np.where(np.arange(N) < 20, 1e-3, 5e-4)
    cols, scalars = _stalled(29, [1], lr)
    _, events = detect(build(LAYERS, cols, scalars))
    (one,) = of(events, "weights_not_updated")
    assert (one.layer, one.step) == ("fc1", 40)
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_a_learning_rate_that_moved_weights_when_last_judged_bounds_the_start():
    """A learning rate below `TOO_SMALL` long before the stall (small weights still moved
    by it) does not date the stall before the last update judged moving: row 31 judges
    the update of step 30 (still) and the one of step 29 (moving)."""
    lr = np.where(np.arange(N) < 5, 1e-3, 1e-9)
    cols, scalars = _stalled(29, [0, 1, 2], lr)
    _, events = detect(build(LAYERS, cols, scalars))
    (model,) = of(events, "weights_not_updated", None, "model")
    assert model.step == 30


def test_a_learning_rate_of_about_0_from_the_start_is_named_as_given_not_as_a_schedule():
    cols, scalars = _stalled(0, [0, 1, 2], np.full(N, 0.0))
    _, events = detect(build(LAYERS, cols, scalars))
    (model,) = of(events, "weights_not_updated", None, "model")
    assert "learning rate is 0 from the start" in model.message, model.message
    assert "per batch" not in model.message


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_stall_between_samples_far_apart_is_dated_alike_in_chunks(chunk):
    """Updates sampled 25 steps apart, the learning rate below `TOO_SMALL` from step 28:
    the stall the sample at step 50 shows is dated from step 28, by a live scan in chunks
    (which reads fewer steps of history than the samples are apart) as by a scan in one
    go."""
    g = noisy(0.1, cols=3)
    upd = np.full((N, 3), np.nan)
    upd[::25] = 1e-3
    upd[50] = 0.0
    w = 5.0 + np.cumsum(np.full((N, 3), 1e-3), 0)
    w[28:] = w[28]
    lr = np.where(np.arange(N) < 28, 1e-3, 1e-12)
    cols = {"grad_norm": g, "update_ratio": upd, "param_norm": w}
    scalars = {"loss": np.ones(N), "lr": lr}
    _, events = detect(build(LAYERS, cols, scalars))
    (model,) = of(events, "weights_not_updated", None, "model")
    assert model.step == 28, model
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]
