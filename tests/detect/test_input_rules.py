"""The input rules on hand-made traces: raw, unnormalised inputs named at step 0 and
blamed for the failure they lead to (`detect.raw_inputs`); batches that come from a
DataLoader iterator made anew at every step (`in_reiter`); a layer whose output jumps by
the factor its input batch jumped is the input's event, not the layer's."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, live_scan, noisy, of, same

from neuraldbg_nb.detect import Thresholds, detect, first_failure

LAYERS = [("conv", "other"), ("fc", "other")]


def _raw_trace(scale: float, first_out: float, explode_at: int | None):
    """Inputs of abs-max `scale` (mean 0.6 of it) every step; the first layer's output
    `first_out` at step 0 and measured every 10th step; the loss exploding 1e4x from
    `explode_at` on."""
    act = noisy(first_out, cols=2)
    act[1:][np.arange(1, N) % 10 != 0] = np.nan
    loss = noisy(1.4, seed=2)[:, 0]
    if explode_at is not None:
        loss[explode_at:] *= 1e4
    cols = {"act_absmax": act, "grad_norm": noisy(0.5, cols=2, seed=1),
            "param_norm": np.ones((N, 2)), "update_ratio": noisy(1e-3, cols=2, seed=4)}
    scalars = {"loss": loss, "in_absmax": np.full(N, scale), "in_mean": np.full(N, 0.6 * scale)}
    return cols, scalars


@pytest.mark.parametrize("explode_at", [20, 40])
def test_raw_pixels_are_named_at_step_0_and_blamed_for_the_failure(explode_at):
    cols, scalars = _raw_trace(255.0, 370.0, explode_at)
    _, events = detect(build(LAYERS, cols, scalars))
    raw = of(events, "data_anomaly", signal="input_raw")
    assert [(e.step, e.severity, e.end) for e in raw] == [(0, "warning", None)], raw
    assert "abs-max 255, mean 153" in raw[0].message
    assert "divide the pixels by 255" in raw[0].message
    assert of(events, "loss_divergence"), events  # the failure itself is still reported
    ff = first_failure(events, Thresholds())
    assert (ff.signal, ff.step) == ("input_raw", 0), ff  # beyond the lookback too


def test_raw_features_of_order_1000_say_standardise():
    cols, scalars = _raw_trace(3000.0, 2.5e3, 5)
    scalars["in_mean"] = np.full(N, -40.0)
    _, events = detect(build(LAYERS, cols, scalars))
    (raw,) = of(events, signal="input_raw")
    assert "standardise each feature" in raw.message and "abs-max 3e+03" in raw.message


@pytest.mark.parametrize("scale, first_out", [(8.0, 6.0),  # inputs of order 1-10
                                              (255.0, 2.0),  # normalised inside (BatchNorm)
                                              (3e4, 1.5)])  # token ids into an Embedding
def test_inputs_the_model_takes_as_they_are_stay_quiet(scale, first_out):
    cols, scalars = _raw_trace(scale, first_out, None)
    _, events = detect(build(LAYERS, cols, scalars))
    assert events == [], events


def test_raw_inputs_unmeasured_at_step_0_are_not_guessed():
    cols, scalars = _raw_trace(255.0, 370.0, None)
    cols["act_absmax"][0] = np.nan  # activations off, or compiled
    _, events = detect(build(LAYERS, cols, scalars))
    assert of(events, signal="input_raw") == []


@pytest.mark.parametrize("chunk", [1, 7, 60])
def test_raw_inputs_live_as_in_one_go(chunk):
    cols, scalars = _raw_trace(255.0, 370.0, 30)
    scalars["in_absmax"][45:] = 1.0  # normalised from step 45 on: the condition ends
    _, events = detect(build(LAYERS, cols, scalars))
    (raw,) = of(events, "data_anomaly", signal="input_raw")
    assert raw.end == 45
    (back,) = of(events, "recovery", signal="input_raw")
    assert back.message == "input batch normalised at step 45 (abs-max 1)"
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def _reiter_trace(flags):
    cols = {"act_absmax": noisy(2.0, cols=2), "grad_norm": noisy(0.5, cols=2, seed=1),
            "param_norm": np.ones((N, 2)), "update_ratio": noisy(1e-3, cols=2, seed=4)}
    scalars = {"loss": noisy(1.4, seed=2)[:, 0], "in_absmax": noisy(3.0, seed=5)[:, 0],
               "in_reiter": np.asarray(flags, float)}
    return cols, scalars


@pytest.mark.parametrize("chunk", [1, 7, 60])
def test_an_iterator_made_anew_every_step_is_an_error_from_its_first_step(chunk):
    flags = [np.nan] + [16.0] * (N - 1)
    cols, scalars = _reiter_trace(flags)
    _, events = detect(build(LAYERS, cols, scalars))
    (e,) = of(events, "data_anomaly", signal="input_reiter")
    assert (e.step, e.severity, e.end, e.value) == (1, "error", None, 16.0)
    assert "next(iter(loader))" in e.message and "of 16 in an epoch" in e.message
    assert first_failure(events, Thresholds()) == e
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(x) for x in det.events] == [same(x) for x in events]


def test_an_iterator_dropped_twice_or_never_is_quiet():
    flags = [np.nan, 16.0, 16.0] + [0.0] * (N - 3)  # two steps, then the loader goes on
    cols, scalars = _reiter_trace(flags)
    _, events = detect(build(LAYERS, cols, scalars))
    assert events == [], events
    cols, scalars = _reiter_trace([0.0] * N)
    assert detect(build(LAYERS, cols, scalars))[1] == []


def test_a_layer_that_jumps_as_its_input_batch_did_is_the_inputs_event():
    # the input's abs-max jumps 160x at step 30 and the first layer's output 150x with
    # it: one event, the input's; at step 45 the input jumps 160x and the second layer
    # 1e4x: that layer's own regime shift stays
    x = noisy(3.0)[:, 0]
    x[[30, 45]] *= 160
    a = noisy(6.0, cols=2)
    a[30, 0] *= 150
    a[45, 1] *= 1e4
    cols = {"act_absmax": a, "grad_norm": noisy(0.5, cols=2, seed=1),
            "param_norm": np.ones((N, 2)), "update_ratio": noisy(1e-3, cols=2, seed=4)}
    scalars = {"loss": noisy(1.4, seed=2)[:, 0], "in_absmax": x}
    _, events = detect(build(LAYERS, cols, scalars))
    shifts = [(e.step, e.layer) for e in of(events, "regime_shift", signal="activation")]
    assert shifts == [(45, "fc")], events
    data = [(e.step, e.severity) for e in of(events, "data_anomaly", signal="input_scale")]
    assert data == [(30, "error"), (45, "error")]  # the model felt both
    assert first_failure(events, Thresholds()).signal == "input_scale"
