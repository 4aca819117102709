"""A GradScaler's loss scale that collapses (`detect.amp`) on hand-made traces: a scale
that fell below 1 within a step's scaled backwards, no optimizer step between, is an
error and the first failure; one that halves a few times at the start and settles, or a
run without a scaler, is quiet."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, live_scan, noisy, of, same

from neuraldbg_nb.detect import Thresholds, detect, first_failure

LAYERS = [("fc1", "other"), ("fc2", "other")]


def _trace(scale_from, scale, nan_grads_at=None):
    grad = noisy(0.5, cols=2, seed=1)
    if nan_grads_at is not None:
        grad[nan_grads_at] = np.inf  # a non-finite norm, as the probe records it
    cols = {"act_absmax": noisy(2.0, cols=2), "grad_norm": grad,
            "param_norm": np.ones((N, 2)), "update_ratio": noisy(1e-3, cols=2, seed=4)}
    scalars = {"loss": noisy(1.4, seed=2)[:, 0], "in_absmax": noisy(3.0, seed=5)[:, 0],
               "amp_scale_from": np.asarray(scale_from, float),
               "amp_scale": np.asarray(scale, float)}
    return cols, scalars


@pytest.mark.parametrize("chunk", [1, 7, 60])
def test_a_scale_that_fell_to_1e_30_with_no_step_is_the_first_failure(chunk):
    # 59 healthy steps at 65536, then the last row: 100 iterations, every one skipped
    first = np.full(N, 65536.0)
    last = np.full(N, 65536.0)
    last[-1] = 65536.0 / 2 ** 99
    cols, scalars = _trace(first, last)
    _, events = detect(build(LAYERS, cols, scalars))
    (e,) = of(events, "nonfinite_gradient", signal="loss_scale")
    assert (e.step, e.layer, e.severity) == (N - 1, None, "error")
    assert "fell from 6.55e+04 to 1.03e-25 over 100 iterations" in e.message
    assert "every step was skipped" in e.message
    assert first_failure(events, Thresholds()) == e
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(x) for x in det.events] == [same(x) for x in events]


def test_the_scale_collapse_tells_the_non_finite_gradients_story():
    first = np.full(N, 65536.0)
    last = np.full(N, 65536.0)
    last[-1] = 0.0  # underflowed: the iterations cannot be counted
    cols, scalars = _trace(first, last, nan_grads_at=N - 1)
    _, events = detect(build(LAYERS, cols, scalars))
    ff = first_failure(events, Thresholds())
    assert (ff.signal, ff.step) == ("loss_scale", N - 1), ff
    assert "fell from 6.55e+04 to 0 by step" in ff.message
    assert of(events, "nonfinite_gradient", signal="gradient"), "the gradients say so too"


def test_a_scale_that_settles_or_no_scaler_is_quiet():
    first = np.full(N, 8192.0)
    last = np.full(N, 8192.0)
    first[0], last[0] = 65536.0, 16384.0  # three skips at the start: 65536 is too high
    first[1], last[1] = 16384.0, 8192.0
    cols, scalars = _trace(first, last)
    assert detect(build(LAYERS, cols, scalars))[1] == []
    cols, scalars = _trace(np.full(N, np.nan), np.full(N, np.nan))
    assert detect(build(LAYERS, cols, scalars))[1] == []
