"""A step schedule stepped per batch (`lr_change`, signal `per_batch`) on hand-made
traces: two 10x falls within `window` steps are one warning from the second, with the
rate's path; falls an epoch apart and a smooth decay are not; a live scan agrees."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, live_scan, noisy, of, same

from neuraldbg_nb.detect import detect

LAYERS = [("fc", "other")]


def _trace_cols(lr: np.ndarray):
    w = np.full((N, 1), 5.0)
    return ({"grad_norm": noisy(0.1), "param_norm": w, "update_ratio": w * np.nan},
            {"loss": np.ones(N), "lr": lr})


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_two_falls_of_10x_within_the_window_are_one_warning_with_the_path(chunk):
    lr = 0.1 * 0.1 ** (np.arange(N) // 6)   # /10 every 6 steps
    cols, scalars = _trace_cols(lr)
    _, events = detect(build(LAYERS, cols, scalars))
    (warned,) = of(events, "lr_change", signal="per_batch")
    assert (warned.step, warned.severity) == (12, "warning")
    assert "0.1 -> 0.01 at step 6, 0.01 -> 0.001 at step 12" in warned.message
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_falls_an_epoch_apart_and_a_smooth_decay_are_not_per_batch():
    for lr in (0.1 * 0.1 ** (np.arange(N) // 25), 0.1 * 0.7 ** np.arange(N)):
        cols, scalars = _trace_cols(lr)
        assert not of(detect(build(LAYERS, cols, scalars))[1], "lr_change",
                      signal="per_batch")


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_halvings_ten_steps_apart_warn_once_they_add_up_to_10x(chunk):
    """StepLR(step_size=10, gamma=0.5) stepped per batch: no single fall is 10x, the
    chain of four is 16x by step 40."""
    lr = 0.02 * 0.5 ** (np.arange(N) // 10)
    cols, scalars = _trace_cols(lr)
    _, events = detect(build(LAYERS, cols, scalars))
    (warned,) = of(events, "lr_change", signal="per_batch")
    assert (warned.step, warned.severity) == (40, "warning")
    assert "fell 16x in 4 drops" in warned.message
    assert "0.02 -> 0.01 at step 10" in warned.message
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_halvings_an_epoch_apart_and_a_cosine_decay_are_not_per_batch():
    steps = np.arange(N)
    cosine = 0.05 * (1 + np.cos(np.pi * np.minimum(steps, N - 1) / N)) / 2 + 1e-6
    for lr in (0.02 * 0.5 ** (steps // 30), cosine):
        cols, scalars = _trace_cols(lr)
        assert not of(detect(build(LAYERS, cols, scalars))[1], "lr_change",
                      signal="per_batch")


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_halvings_at_the_first_batch_of_short_epochs_are_not_per_batch(chunk):
    """Halved every 10 steps, as StepLR(10, 0.5) stepped per batch would: where each
    drop comes at the first batch of a DataLoader's epoch (`in_epoch_start`), it is a
    schedule stepped once an epoch of 10 batches; where the epochs are longer, a warning."""
    lr = 0.02 * 0.5 ** (np.arange(N) // 10)
    found = {}
    for epoch in (10, 30):
        cols, scalars = _trace_cols(lr)
        scalars["in_epoch_start"] = (np.arange(N) % epoch == 0).astype(np.float64)
        _, events = detect(build(LAYERS, cols, scalars))
        found[epoch] = [e.step for e in of(events, "lr_change", signal="per_batch")]
        _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
    assert found == {10: [], 30: [40]}
