"""The gradient detector (`detect.gradients`) on hand-made traces: vanishing (with its
recovery band, and not for a gradient starting from an exact zero or shrinking with a
loss that fits exactly), exploding (against a line that a run starting above it moves),
frozen and cut-off layers. Each live scan, in chunks, gives the events of a one-go
`detect`."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, live_scan, noisy, of, same

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_gradient_that_climbs_above_the_line_step_by_step_is_not_exploding(chunk):
    # a run whose gradients start at 150 (targets not normalised) lives at that scale,
    # and its norms grow with it, as a regression's do while its weights grow to targets
    # of order 1000 (1.3e3 -> 2.5e5 in 400 healthy steps under Adam): "creep" grows 15% a
    # step, above the line (1.5e3) from step 17 but exploding only from 100x it (step
    # 50); "fast" grows 30% a step, above the line from step 9 and 10x its mean of the
    # steps before it from step 17 (16x a full window's). In a run at the classic scale
    # (starting at 0.5) the line decides.
    k = np.arange(N)[:, None]
    layers = [("creep", "other"), ("fast", "other")]
    scalars = {"loss": noisy(1.0, seed=3)[:, 0]}
    for start, expected in ((150.0, [("fast", 17), ("creep", 50)]),
                            (0.5, [("fast", 29), ("creep", 55)])):
        g = start * np.concatenate([1.15 ** k, 1.3 ** k], axis=1)
        cols = {"grad_norm": g, "param_norm": np.ones((N, 2)),
                "update_ratio": noisy(1e-3, cols=2)}
        _, events = detect(build(layers, cols, scalars))
        found = [(e.layer, e.step) for e in of(events, "exploding_gradient", signal="gradient")]
        assert found == expected
        _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_gradients_that_start_above_the_exploding_line_move_it(chunk):
    # a loss summed over the batch: "a" starts at 1.8e3 and wanders between 1e3 and 7e3,
    # "b" starts at 600 and crosses 1e3 back and forth; at step 40, "b" explodes 30x
    g = np.concatenate([noisy(3e3, sigma=0.5, seed=1), noisy(1e3, sigma=0.3, seed=2)], 1)
    g[0] = [1.8e3, 600.0]
    g[40, 1] = 3.9e4
    layers = [("a", "other"), ("b", "other")]
    cols = {"grad_norm": g, "param_norm": np.ones((N, 2)), "update_ratio": noisy(1e-3, cols=2)}
    trace = build(layers, cols)
    assert list(trace.first_grad_norm) == [1.8e3, 600.0]
    _, events = detect(trace)
    exploding = [(e.step, e.layer, e.severity, e.signal) for e in of(events, "exploding_gradient")]
    assert exploding == [(0, "a", "info", "scale"), (40, "b", "error", "gradient")]
    assert "summed over the batch" in of(events, "exploding_gradient")[0].message
    assert "1.8e+04" in of(events, "exploding_gradient")[0].message  # 10 x 1.8e3
    # `explode` still moves the line, scaled alike: 1e4 -> 1.8e5, above the blow-up
    moved = detect(trace, ndbg.Thresholds(explode=1e4))[1]
    assert [e.severity for e in of(moved, "exploding_gradient")] == ["info"]
    _, det, _ = live_scan(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]
    # near the line at the first step, it moves by less; from below 100, not at all
    g[0] = [900.0, 600.0]
    near = of(detect(build(layers, cols))[1], "exploding_gradient")
    assert "above 9e+03" in near[0].message and near[0].severity == "info"
    g[0] = [90.0, 60.0]
    assert [(e.step, e.layer, e.severity) for e in of(detect(build(layers, cols))[1],
                                                      "exploding_gradient")][:1] == [
        (1, "a", "error")]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_layer_that_runs_without_gradients_from_a_step_on_was_frozen(chunk):
    # "fc" has no gradient from step 30 on while it runs (requires_grad turned off);
    # "backbone" never had one (frozen from the start); "head" sits out 4 steps of 5; "gone"
    # neither runs nor has a gradient from step 30 (a branch no longer taken)
    g = noisy(1e-2, cols=4)
    g[30:, 0] = np.nan
    g[:, 1] = np.nan
    g[np.arange(N) % 5 != 0, 2] = np.nan
    g[30:, 3] = np.nan
    a = noisy(2.0, cols=4)
    a[30:, 3] = np.nan
    layers = [("fc", "other"), ("backbone", "other"), ("head", "other"), ("gone", "other")]
    cols = {"grad_norm": g, "act_absmax": a, "param_norm": np.ones((N, 4)),
            "update_ratio": noisy(1e-3, cols=4)}
    _, events = detect(build(layers, cols))
    frozen = of(events, "vanishing_gradient", signal="frozen")
    assert [(e.layer, e.step, e.severity, e.end) for e in frozen] == [("fc", 30, "info", None)]
    assert "frozen (requires_grad off)" in frozen[0].message
    assert [e for e in events if e.severity != "info"] == []
    _, det, _ = live_scan(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_gradient_settled_at_the_vanish_line_gives_one_event():
    # a dying layer: its norm below 1e-6 on some batches and just above on others, for
    # longer than patience each time (a 12-step data cycle); healthy again from step 52
    g = noisy(1e-2, cols=1)
    g[16:52, 0] = ([8e-7] * 6 + [1.5e-6] * 6) * 3
    trace = build([("a", "other")], {"grad_norm": g})
    _, events = detect(trace)
    van = of(events, "vanishing_gradient")
    assert [(e.step, e.end) for e in van] == [(16, 52)]
    assert [e.step for e in of(events, "recovery", "a", "gradient")] == [52]
    # a norm that starts in the band (small but never below the line) is no event
    assert of(detect(build([("a", "other")], {"grad_norm": noisy(3e-6)}))[1],
              "vanishing_gradient") == []


@pytest.mark.parametrize("chunk", [1, 2, 60])
def test_the_recovery_band_does_not_count_towards_patience(chunk):
    # a zero-initialised residual branch: its gradient is exactly 0 at the first step and
    # climbs through the band [vanish, 10 x vanish) (numbers of a ResNet with
    # zero_init_residual); the band's steps are not "vanishing" ones
    g = noisy(1e-2, cols=2)
    g[:4, 0] = [0.0, 2.76e-6, 7.2e-6, 1.48e-5]
    # below the line on every other step, in the band in between: three steps below
    g[20:25, 1] = [5e-7, 3e-6, 5e-7, 3e-6, 5e-7]
    layers = [("a", "other"), ("b", "other")]
    cols = {"grad_norm": g, "param_norm": np.ones((N, 2)), "update_ratio": noisy(1e-3, cols=2)}
    _, events = detect(build(layers, cols))
    assert of(events, "vanishing_gradient", "a") == []
    van = of(events, "vanishing_gradient", "b")
    assert [(e.step, e.end) for e in van] == [(20, 25)]
    # the same, scanned live in chunks (the count is carried from chunk to chunk)
    _, det, _ = live_scan(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_gradient_climbing_from_an_exact_zero_at_the_first_step_is_not_vanishing(chunk):
    # a layer upstream of a zero-initialised BatchNorm weight: 0 at step 0, then climbing
    # by about 1.6x a step (a ResNet's: 1.2e-7, 3.1e-7, 5.3e-7, ...): below the line for
    # five steps, but starting, not vanishing
    g = noisy(1e-2, cols=4)
    g[0] = 0.0
    g[1:17, 0] = 1.2e-7 * 1.6 ** np.arange(16)
    g[1:, 1] = 0.0        # 0 and it stays 0 (a model initialised all to zeros)
    g[1:17, 2] = 1e-8     # 0, then flat below the line: starting only while it rises
    g[1:17, 3] = 1.2e-7 * 1.6 ** np.arange(16)
    g[30:40, 3] = 1e-8    # the climbing one, vanishing later all the same
    layers = [(c, "other") for c in "abcd"]
    cols = {"grad_norm": g, "param_norm": np.ones((N, 4)), "update_ratio": noisy(1e-3, cols=4)}
    _, events = detect(build(layers, cols))
    van = {e.layer: (e.step, e.signal, e.severity) for e in of(events, "vanishing_gradient")}
    assert van == {"b": (1, "cut", "warning"), "c": (2, "gradient", "error"),
                   "d": (30, "gradient", "error")}  # exactly 0: nothing reaches it
    _, det, _ = live_scan(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_layer_used_one_step_in_five_is_not_cut_off(chunk):
    # task heads trained in turn, gradients zeroed (not set to None): each head reads
    # exactly 0 four steps in five, which is not "cut off" for good; a head that stops being
    # trained at step 30 is cut off from there
    g = noisy(0.3, cols=2)
    g[np.arange(N) % 5 != 0, 0] = 0.0
    g[30:, 1] = 0.0
    layers = [("turns", "other"), ("stopped", "other")]
    cols = {"grad_norm": g, "param_norm": np.ones((N, 2)), "update_ratio": noisy(1e-3, cols=2)}
    scalars = {"loss": noisy(1.0, seed=3)[:, 0]}
    _, events = detect(build(layers, cols, scalars))
    found = [(e.layer, e.step, e.signal) for e in of(events, "vanishing_gradient")]
    assert found == [("stopped", 30, "cut")]
    _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, 300])
def test_gradients_that_vanish_as_the_loss_falls_to_an_exact_fit_are_not_vanishing(chunk):
    # a fit of exact targets: the loss falls 8 decades in 300 steps and the gradient 5,
    # below the line from step 240: converging; the same gradient with a loss that stays
    # is vanishing, from step 240
    n = 300
    g = 0.999e-2 * 10 ** (-np.arange(n) / 60.0)[:, None]
    layers = [("fit", "other")]
    cols = {"grad_norm": g, "param_norm": np.ones((n, 1)), "update_ratio": noisy(1e-3, n=n)}
    for falls, expected in ((True, []), (False, [240])):
        loss = 1e-4 * (10 ** (-np.arange(n) / 37.5) if falls else np.ones(n))
        scalars = {"loss": loss * noisy(1.0, n=n, seed=3)[:, 0]}
        _, events = detect(build(layers, cols, scalars, n=n))
        assert [e.step for e in of(events, "vanishing_gradient")] == expected
        _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
