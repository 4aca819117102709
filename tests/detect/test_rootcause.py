"""The first failure (`detect.rootcause`) among the events of hand-made traces: the
loudest exploding gradient, an activation jump before the gradients explode, and a
failure that grew from a warning, dated from the warning."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, live_scan, noisy, of, same

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect, first_failure


def test_exploding_gradient_root_is_the_layer_with_the_highest_norm():
    g = noisy(1.0, cols=3)
    g[30, 0] = 5e3
    g[30, 1] = 2e4
    trace = build([("a", "other"), ("b", "other"), ("c", "other")], {"grad_norm": g})
    _, events = detect(trace)
    exp = of(events, "exploding_gradient")
    assert sorted((e.step, e.layer) for e in exp) == [(30, "a"), (30, "b")]
    assert all(e.severity == "error" for e in exp)
    root = first_failure(events, ndbg.Thresholds())
    assert (root.step, root.layer, root.kind) == (30, "b", "exploding_gradient")
    # a gradient jump is a symptom, never a cause on its own: no errors from it
    assert all(e.severity != "error" for e in of(events, "regime_shift"))


def test_an_activation_jump_before_the_exploding_gradients_is_the_root():
    g = noisy(1.0, cols=3)
    a = noisy(2.0, cols=3, seed=1)
    a[30:, 1] *= 500                # layer b's activations jump at step 30 ...
    g[30:, :] = 5e4                 # ... and every gradient explodes
    g[30:, 2] = 9e4                 # the loudest gradient is c's
    trace = build([("a", "other"), ("b", "other"), ("c", "other")],
                  {"grad_norm": g, "act_absmax": a})
    _, events = detect(trace)
    root = first_failure(events, ndbg.Thresholds())
    assert (root.step, root.layer, root.kind) == (30, "b", "regime_shift")


def test_a_failure_that_grew_from_a_warning_is_dated_from_the_warning():
    # a learning rate raised 10x: units die, 71% from step 20 (a warning), and 91% from
    # step 40 (an error): the failure began at step 20, not where it became an error; a
    # warning of another layer that ended at step 40 is no part of it
    d = np.full((N, 2), 0.1)
    d[20:, 0] = 0.71
    d[40:, 0] = 0.91
    d[25:40, 1] = 0.6
    trace = build([("r", "relu"), ("s", "relu")], {"dead_frac": d})
    _, events = detect(trace)
    assert [(e.layer, e.step, e.severity) for e in of(events, "dead_units")] == [
        ("r", 20, "warning"), ("s", 25, "warning"), ("r", 40, "error")]
    root = first_failure(events, ndbg.Thresholds())
    assert (root.layer, root.step, root.severity) == ("r", 20, "warning")
    # the error says what the units were as the warning (71%), not when healthy (10%)
    grew = of(events, "dead_units", "r")[1]
    assert grew.previous == pytest.approx(0.71) and "was 71%" in grew.message
    for chunk in (1, 7):  # and a live scan, in chunks, says the same
        cols = {"dead_frac": d, "param_norm": np.ones((N, 2)),
                "update_ratio": np.full((N, 2), 1e-3)}
        _, det, _ = live_scan([("r", "relu"), ("s", "relu")], cols, {"loss": np.ones(N)},
                          chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
