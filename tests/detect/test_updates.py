"""The optimizer-update detector (`detect.updates`) on hand-made traces: exploding
updates (and what is not one: weights growing from zeros, LayerScale gains, a parameter
of a few numbers crossing zero), weights that collapse in one update or shrink over ten,
weights left unchanged (out of the optimizer, a learning rate of 0, half-precision
updates that round away), and learning-rate changes."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, live_scan, noisy, of, same

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect, first_failure


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_weights_growing_from_zeros_are_not_an_exploding_update(chunk):
    # "a": zeros before the update of step 0 (the weight probe's ratio is inf there), then
    # SGD with momentum 0.9: each update 1 + 0.9 + ... times the first, so the norm goes
    # 1, 2.9, 5.6, ... (x2.9 in the update of step 1); "b" the same from a norm of 1, an
    # optimizer blow-up; "c" grows from zeros, then is multiplied by 5 in place at step 30
    # (after `GROWING` updates); "d" grows from zeros and goes non-finite at step 3; "e"
    # grows from zeros one step late, under a warm-up whose first learning rate is 0: its
    # first move, at step 1, is not sampled (a LoRA B matrix under Hugging Face's linear
    # warm-up, which judged against its first norm reads "changed by 1.84x" at step 2)
    v = np.cumsum(0.9 ** np.arange(N))
    grown = np.cumsum(v)
    late = np.concatenate([[0.0], grown[:-1]])
    w = np.stack([grown, 1 + grown, grown, grown, late], axis=1) * 0.0036
    w[30:, 2] *= 5
    w[3:, 3] = np.inf
    upd = np.full((N, 5), np.nan)
    upd[::10] = 1e-3
    upd[0] = [np.inf, 1.0, np.inf, np.inf, np.nan]
    layers = [(c, "other") for c in "abcde"]
    cols = {"grad_norm": noisy(1e-2, cols=5), "param_norm": w, "update_ratio": upd}
    _, events = detect(build(layers, cols))
    found = {e.layer: (e.step, e.severity) for e in of(events, "exploding_update")}
    assert found == {"b": (0, "error"), "c": (30, "error"), "d": (3, "error")}
    _, det, _ = live_scan(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_layerscale_gains_growing_from_next_to_nothing_are_not_an_exploding_update():
    # 64 gains initialised at 1e-5 (LayerScale: CaiT, ConvNeXt, DINOv2), then Adam's steps
    # of 5e-5 each: step 0's update is 5x their size (read alone: "changed by 5x"), and
    # no norm is read before it (the update's size bounds it). The same
    # numbers for a layer too large to be read whole are still an exploding update.
    w = 8e-5 + 4e-4 * np.arange(1, N + 1)
    cols = {"grad_norm": noisy(1e-2, cols=2), "param_norm": np.stack([w, w], axis=1),
            "update_ratio": np.full((N, 2), np.nan)}
    cols["update_ratio"][0] = 5.0
    trace = build([("ls", "other"), ("big", "other")], cols)
    trace.update_layer(0, params=64)
    trace.update_layer(1, params=100_000)
    found = [(e.layer, e.step) for e in of(detect(trace)[1], "exploding_update")]
    assert found == [("big", 0)]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_first_update_the_size_of_the_learning_rate_on_small_weights_is_a_warning(chunk):
    # prompt tuning: 512 weights of RMS 0.02 (norm 0.45), Adam at lr 0.03 moves each by
    # 0.03, 1.54x their size (norm after: 0.78); at lr 0.003 the same update is 10x what
    # the learning rate moves (an error); an update of 15x is an error whatever its lr;
    # so is one of 1.54x at step 30, past the run's start
    w = np.concatenate([[0.78], 0.78 * 1.001 ** np.arange(1, N)])[:, None]
    found = {}
    for name, lr, ratio, at in (("prompt", 0.03, 1.544, 0), ("slow", 0.003, 1.544, 0),
                                ("huge", 0.03, 15.0, 0), ("late", 0.03, 1.544, 30)):
        upd = np.full((N, 1), np.nan)
        upd[::5] = 1e-3
        upd[at] = ratio
        norms = w.copy()
        norms[at:] *= 1.0 if at == 0 else 2.5
        layers = [(name, "other", True, 512)]
        cols = {"param_norm": norms, "update_ratio": upd, "grad_norm": noisy(1e-2)}
        scalars = {"loss": np.ones(N), "lr": np.full(N, lr)}
        _, events = detect(build(layers, cols, scalars))
        found[name] = [(e.step, e.severity) for e in of(events, "exploding_update")]
        _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
        if name == "prompt":
            assert "each moved by about the learning rate (0.03)" in events[0].message
    assert found == {"prompt": [(0, "warning")], "slow": [(0, "error")],
                     "huge": [(0, "error")], "late": [(30, "error")]}


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_first_update_after_which_the_loss_halved_is_a_warning(chunk):
    """A small head growing to its targets' scale: its update at step 1 moves it 1.06x its
    size (SGD, each weight by more than the learning rate) and the loss falls 8.2 -> 3.3
    after it: a warning. The same update where the loss stays within a batch's noise is
    an error, and so is one past the run's start."""
    found = {}
    for name, fall, at in (("fitting", 2.5, 1), ("flat", 1.02, 1), ("late", 2.5, 30)):
        norms = np.full((N, 1), 0.59)
        norms[at:] = 0.59 * 2.06
        loss = np.full(N, 8.2)
        loss[at + 1:] = 8.2 / fall
        layers = [(name, "other", True, 33)]
        cols = {"param_norm": norms, "update_ratio": np.full((N, 1), np.nan),
                "grad_norm": noisy(6.0)}
        scalars = {"loss": loss, "lr": np.full(N, 0.05)}
        _, events = detect(build(layers, cols, scalars))
        found[name] = [(e.step, e.severity) for e in of(events, "exploding_update")]
        _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
        if name == "fitting":
            assert "the loss fell after it (8.2 -> 3.28)" in events[0].message, events[0]
    assert found == {"fitting": [(1, "warning")], "flat": [(1, "error")],
                     "late": [(30, "error")]}


def test_a_parameter_of_a_few_numbers_crossing_zero_is_not_an_exploding_update():
    # a normalising flow's 2-number scale under Adam: its norm 0.00153 -> 0.00067 ->
    # 0.000113 -> 0.000825 as one number crosses zero ("changed by 6.31x"); the same
    # numbers for a layer of 1000 weights are an exploding update, and non-finite weights
    # are one whatever the size
    w = np.ones((N, 3))
    w[30:34, :] = np.array([0.00153, 0.00067, 0.000113, 0.000825])[:, None]
    w[34:, :] = 0.0009
    w[50:, 2] = np.inf
    trace = build([("scale", "other"), ("big", "other"), ("blown", "other")],
                  {"grad_norm": noisy(1e-2, cols=3), "param_norm": w})
    for i, n in enumerate((2, 1000, 2)):
        trace.update_layer(i, params=n)
    events = detect(trace)[1]
    found = {(e.layer, e.step) for e in of(events, "exploding_update", signal="update")}
    assert found == {("big", 33), ("blown", 50)}
    # the big layer's fall to a 650th at step 30 is one too (a difference of norms reads
    # no more than 1x the weights' size on the way down: `updates.COLLAPSE`), and not
    # also a slow shrink
    fell = [(e.layer, e.step, e.severity) for e in of(events, "exploding_update")
            if e.signal in ("collapse", "shrink")]
    assert fell == [("big", 30, "error")]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_weights_that_fall_in_one_update_are_a_collapse(chunk):
    # "zeroed": weights zeroed in place, the bias kept (1.76 -> 0.616, 2.9x: a warning);
    # "reset": 2.06 -> 0.175 (12x: an error, not also a slow shrink); "decay": halved by
    # each update, 1.997x (a weight decay far too strong: the shrink rule's, later);
    # "gains": LayerScale-sized weights that each update moves by the learning rate
    n = N
    w = np.ones((n, 4)) * [1.76, 2.06, 6.17, 2e-3]
    w[30:, 0] = 0.616
    w[30:, 1] = 0.175
    w[20:, 2] = 6.17 / 1.997 ** np.arange(1, n - 19)
    w[30:, 3] = 0.9e-3
    layers = [("zeroed", "other", True, 80), ("reset", "other", True, 198),
              ("decay", "other", True, 4096), ("gains", "other", True, 64)]
    cols = {"grad_norm": noisy(1e-2, cols=4), "act_absmax": noisy(1.0, cols=4),
            "param_norm": w, "update_ratio": np.full((n, 4), np.nan)}
    scalars = {"loss": noisy(1.0, seed=3)[:, 0], "lr": np.full(n, 1e-3)}
    _, events = detect(build(layers, cols, scalars))
    fell = [(e.layer, e.step, e.severity) for e in of(events, "exploding_update",
                                                        signal="collapse")]
    assert fell == [("zeroed", 30, "warning"), ("reset", 30, "error")]
    assert "lost 65% of their size during step 30 (1.76 -> 0.616)" in of(
        events, "exploding_update", "zeroed")[0].message
    shrink = [(e.layer, e.severity) for e in of(events, "exploding_update", signal="shrink")]
    assert shrink == [("decay", "warning")]
    _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_weights_that_shrink_tenfold_within_ten_updates_are_a_warning(chunk):
    # a weight decay set 500x too strong at step 30: the norm halves at every update (each
    # update 0.5x, below `max_update`); another layer's norm falls 2x over 30 steps
    w = np.ones((N, 2))
    w[30:, 0] = 0.5 ** np.arange(1, N - 29)
    w[:, 1] = 2.0 ** (-np.clip(np.arange(N) - 20, 0, 30) / 30)
    layers = [("fc", "other"), ("slow", "other")]
    cols = {"grad_norm": noisy(1e-2, cols=2), "param_norm": w,
            "update_ratio": np.full((N, 2), np.nan)}
    _, events = detect(build(layers, cols))
    shrink = of(events, "exploding_update", signal="shrink")
    assert [(e.layer, e.step, e.severity) for e in shrink] == [("fc", 33, "warning")]
    assert "weights shrank 16x in the last 10 updates" in shrink[0].message
    _, det, _ = live_scan(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_weights_left_unchanged_by_two_updates_in_a_row_are_a_warning():
    """A layer out of the optimizer: at a sampled step its update size is exactly 0 while
    it has gradients, and the update before left its weight norm the same number. One
    zero update (a warm-up's first step at a learning rate of 0) is not enough, and
    neither is a gradient left over from an earlier step (the same norm again), nor a
    layer another optimizer trains."""
    g = noisy(0.1, cols=3)
    upd = np.full((N, 3), np.nan)
    upd[::10] = 1e-3
    w = 5.0 + np.cumsum(np.full((N, 3), 1e-3), 0)  # weight norm after each update
    upd[20::10, 0] = 0.0                 # out of the optimizer from step 20
    w[19:, 0] = w[19, 0]
    upd[0, 1] = 0.0                      # warm-up: step 0 at lr 0
    upd[30::10, 2] = 0.0                 # not moved from step 30 ...
    w[29:, 2] = w[29, 2]
    g[29:, 2] = g[29, 2]                 # ... but its gradient is stale from step 29 on
    layers = [("fc0", "other"), ("fc1", "other"), ("fc2", "other")]
    t = build(layers, {"grad_norm": g, "update_ratio": upd, "param_norm": w})
    _, events = detect(t)
    (stuck,) = of(events, "weights_not_updated")
    assert (stuck.layer, stuck.step, stuck.severity) == ("fc0", 30, "warning"), stuck
    assert "not in the optimizer" in stuck.message and stuck.end is None
    assert first_failure(events, ndbg.Thresholds()) is None

    upd[:, 1] = np.where(np.isnan(upd[:, 1]), np.nan, 0.0)  # no update at all
    w[:, 1] = 5.0
    other = build(layers[:2], {"grad_norm": g[:, :2], "update_ratio": upd[:, :2],
                               "param_norm": w[:, :2]})
    other.update_layer(0, primary_lr=False)  # trained by another optimizer: not judged
    assert [(e.layer, e.step) for e in of(detect(other)[1], "weights_not_updated")] == \
        [("fc1", 10)]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_weights_left_unchanged_at_an_exact_fit_are_not_judged(chunk):
    """At the float32 floor (the loss 1e12x below its first value) an update of the
    gradients left rounds away: nothing is left to learn, not a layer out of the
    optimizer. The same stall while the loss is where it began is a warning, and so is
    one at the floor where the learning rate was brought to about 0 (a schedule)."""
    found = {}
    for name, floor, rate in (("fitted", 1e-13, 0.02), ("learning", 1.0, 0.02),
                              ("decayed", 1e-13, 1e-10)):
        upd = np.full((N, 1), np.nan)
        upd[::10] = 1e-3
        upd[40::10] = 0.0
        w = 3.0 + np.cumsum(np.full((N, 1), 1e-3), 0)
        w[39:] = w[39]
        loss = np.full(N, 2.0)
        loss[20:] = floor
        layers = [(name, "other")]
        cols = {"grad_norm": noisy(1e-7), "update_ratio": upd, "param_norm": w}
        scalars = {"loss": loss, "lr": np.full(N, rate)}
        _, events = detect(build(layers, cols, scalars))
        found[name] = [(e.step, e.severity) for e in of(events, "weights_not_updated")]
        _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
    # (the only layer: at a learning rate of about 0, also the whole model, an error,
    # both dated from the first update that left it (40): the rate was about 0 all along)
    assert found == {"fitted": [], "learning": [(50, "warning")],
                     "decayed": [(40, "error"), (40, "warning")]}


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_weights_left_unchanged_at_a_learning_rate_of_0_or_next_to_it_say_so(chunk):
    # the learning rate set to 0 at step 25; a scheduler stepped per batch (x0.5 a step
    # from step 20 on, below 1e-8 from step 40): the sentence names the rate, not a layer
    # left out of the optimizer
    g = noisy(0.1)
    upd = np.full((N, 1), np.nan)
    upd[::10] = 1e-3
    w = 5.0 + np.cumsum(np.full((N, 1), 1e-3), 0)
    found = []
    for lr in (np.where(np.arange(N) < 25, 1e-3, 0.0),
               1e-3 * 0.5 ** np.clip(np.arange(N) - 20, 0, None)):
        still = np.flatnonzero(lr < 1e-8)[0]
        u, ww = upd.copy(), w.copy()
        u[still + 1:][~np.isnan(u[still + 1:])] = 0.0
        ww[still:] = ww[still]
        cols = {"grad_norm": g, "update_ratio": u, "param_norm": ww}
        scalars = {"loss": np.ones(N), "lr": lr}
        _, events = detect(build([("fc", "other")], cols, scalars))
        found += [e.message.split(": ", 2)[2]
                  for e in of(events, "weights_not_updated", "fc")]
        _, det, _ = live_scan([("fc", "other")], cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
    assert found == ["the learning rate is 0 since step 25 (was 0.001)",
                     "the learning rate is 7.63e-09, down from 0.001 at step 20"]


def test_half_precision_updates_that_round_away_are_a_layer_that_stopped_learning():
    """A half-precision layer whose update leaves nine in ten of its weights exactly as
    they were has stopped learning (the updates round away): a warning at the step of
    that update, which says why and at which learning rate. One event for a fraction
    hovering at the line, a recovery once it falls well below it; an update at a learning
    rate of 0 and a stale gradient are not judged; float32 layers (no fraction) are not
    judged by it."""
    g = noisy(0.1, cols=3)
    unmoved = np.full((N, 3), np.nan)    # the update of step s is in row s (sampled)
    unmoved[::10, :2] = 0.3
    unmoved[20::10, 0] = 0.95            # rounds away from the update of step 20 ...
    unmoved[50, 0] = 0.5                 # ... and moves again at step 50
    unmoved[10::10, 1] = [0.92, 0.85, 0.93, 0.86, 0.91]  # hovers at the line from 10
    lr = np.full(N, 1e-5)
    t = build([("fc0", "other"), ("fc1", "other"), ("fc2", "other")],
              {"grad_norm": g, "update_unmoved": unmoved, "update_ratio": np.where(
                  np.isnan(unmoved), np.nan, 1e-4), "param_norm": np.full((N, 3), 5.0)},
              {"lr": lr})
    _, events = detect(t)
    rounded = of(events, "weights_not_updated", signal="rounding")
    assert [(e.layer, e.step, e.severity) for e in rounded] == \
        [("fc1", 10, "warning"), ("fc0", 20, "warning")], rounded
    assert "95% of its half-precision weights" in rounded[1].message
    assert "learning rate of 1e-05" in rounded[1].message and "autocast" in rounded[1].message
    (back,) = of(events, "recovery", layer="fc0")
    assert (back.step, rounded[1].end) == (50, 50)
    assert rounded[0].end is None        # 0.85 and 0.86 are not a recovery
    assert not of(events, "weights_not_updated", layer="fc2")  # float32: not judged here
    assert first_failure(events, ndbg.Thresholds()) is None

    lr[20] = lr[21] = 0.0                # the update of step 20 at a learning rate of 0
    g[20:, 1] = g[20, 1]                 # fc1's gradient stale from step 20 on
    unmoved[10, 1] = 0.3
    t = build([("fc0", "other"), ("fc1", "other")],
              {"grad_norm": g[:, :2], "update_unmoved": unmoved[:, :2]}, {"lr": lr})
    assert [(e.layer, e.step) for e in of(detect(t)[1], "weights_not_updated")] == \
        [("fc0", 30)]
    assert not of(detect(t, ndbg.Thresholds(unmoved=0.99))[1], "weights_not_updated")


def test_a_learning_rate_moved_by_about_the_jump_factor_is_a_change():
    # StepLR(gamma=0.1) from 0.05: 0.05 * 0.1 is 0.005000000000000001, a factor of 10 that
    # reads 0.9999999999999999 decades and is still a change of 10x. A base rate
    # raised 10x under a cosine schedule that decays it in the same step moves 9.975x
    # (step 50); a warm-up's 9x (step 55) is not a jump
    lr = np.full(N, 0.05)
    lr[20:] = 0.05 * 0.1
    lr[40:] = 0.05 * 0.1 * 0.1
    lr[50:] = lr[49] * 9.975
    lr[55:] = lr[54] * 9.0
    cols = {"grad_norm": noisy(1e-2), "param_norm": np.ones((N, 1))}
    _, events = detect(build([("a", "other")], cols, {"lr": lr}))
    assert [e.step for e in of(events, "lr_change")] == [20, 40, 50]
