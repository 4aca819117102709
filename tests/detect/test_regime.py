"""Regime shifts (`detect.regime`) on hand-made traces: a layer's activations or
gradients jumping against their own history (not an absolute change, not a slow drift,
not before `warmup` steps), an output that becomes exactly zero, a gradient that falls for
one step (the batch) or with a loss that fell (convergence), and a jump that holds though
it raises its own baseline."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, live_scan, noisy, of, same

from neuraldbg_nb.detect import detect


def test_regime_shift_is_relative_to_the_layers_own_history():
    a = np.concatenate([noisy(1e-3, seed=4), noisy(10.0, seed=5), noisy(1e-3, seed=6)], 1)
    a[30:, 0] *= 100                # a layer at 1e-3 jumping 100x
    a[30:, 1] += 0.099              # same absolute change at scale 10: nothing
    a[30:, 2] *= 1000               # 1000x: an error
    trace = build([("small", "other"), ("big", "other"), ("tiny", "other")],
                  {"act_absmax": a})
    _, events = detect(trace)
    small = of(events, "regime_shift", "small", "activation")
    assert [e.step for e in small] == [30]
    assert small[0].severity in ("warning", "error")
    assert small[0].previous == pytest.approx(1e-3, rel=0.1)
    assert of(events, "regime_shift", "big") == []
    tiny = of(events, "regime_shift", "tiny", "activation")
    assert [(e.step, e.severity) for e in tiny] == [(30, "error")]
    assert "1e+03x" in tiny[0].message or "jumped" in tiny[0].message


def test_slow_drift_is_not_a_regime_shift():
    a = (1.1 ** np.arange(N))[:, None] * noisy(1.0, seed=7)   # x1.1 per step: 300x in all
    trace = build([("drift", "other")], {"act_absmax": a})
    assert of(detect(trace)[1], "regime_shift") == []


def _sparse(values: np.ndarray, every: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """`values` measured at every `every`-th step only, as the sampled layer hooks leave
    them (NaN between), and the `hooked` column that says so."""
    on = np.arange(len(values)) % every == 0
    out = values.copy()
    out[~on] = np.nan
    return out, on.astype(np.float32)


def test_a_jump_at_a_measured_step_is_found_where_the_hooks_skip_steps():
    """Hooked every 10th step (sampled), a window of 20 steps holds two measured values:
    a 1000x jump at a measured step (a replayed one) is judged against them."""
    a, on = _sparse(noisy(1.0, n=120))
    a[75] = 1000.0  # a step between the sampled ones, measured by its replay
    on[75] = 1
    trace = build([("x", "other")], {"act_absmax": a}, {"hooked": on}, n=120)
    found = of(detect(trace)[1], "regime_shift", "x", "activation")
    assert [(e.step, e.severity) for e in found] == [(75, "error")]
    assert found[0].previous == pytest.approx(1.0, rel=0.2)


def test_steady_growth_between_sparse_measurements_is_not_a_jump():
    """An output growing 8% a step (a model fitting fast) moves 2.2x between two sampled
    steps and 10x in 30 steps: judged against the measured steps of its own window, not
    against older ones, it is no regime shift."""
    a, on = _sparse((1.08 ** np.arange(120))[:, None] * noisy(1.0, n=120, seed=3))
    trace = build([("x", "other")], {"act_absmax": a}, {"hooked": on}, n=120)
    assert of(detect(trace)[1], "regime_shift") == []


def test_fast_growth_sampled_every_tenth_step_reads_as_it_does_densely():
    """Logits level at 0.16, then growing 23% a step from step 16 as a classifier learns
    (0.37 at step 20, 2.9 at step 30), measured at the sampled and reference steps: at
    step 30 they stand 14x above the mean of the three measured steps of their window but
    8x above the last one, as far as densely measured values stand from their window's
    mean (half a window back), under the 10x jump. Quiet either way."""
    steps = np.arange(60)
    grown = (0.16 * 1.23 ** np.maximum(steps - 16, 0))[:, None]
    reference = np.isin(steps, [0, 1, 2, 4, 8, 16, 32])
    for hooked in (np.ones(60, bool), (steps % 10 == 0) | reference):
        a = np.where(hooked[:, None], grown, np.nan)
        trace = build([("x", "other")], {"act_absmax": a},
                      {"hooked": hooked.astype(np.float32)}, n=60)
        assert of(detect(trace)[1], "regime_shift") == [], hooked.sum()


def test_sparse_activation_baselines_are_the_same_scanned_live():
    a, on = _sparse(noisy(1.0, n=N, seed=2), every=4)
    a[44] = 500.0
    layers = [("x", "other")]
    cols = {"act_absmax": a, "grad_norm": noisy(1.0, n=N), "param_norm": noisy(1.0, n=N),
            "update_ratio": noisy(1e-3, n=N)}
    scalars = {"loss": noisy(1.0, n=N)[:, 0], "hooked": on}
    whole = [(e.step, e.kind) for e in detect(build(layers, cols, scalars))[1]]
    assert (44, "regime_shift") in whole
    for chunk in (1, 7):
        streamed = live_scan(layers, cols, scalars, chunk)[2]
        assert sorted((e.step, e.kind) for e in streamed) == sorted(whole)


def test_regime_shift_needs_warmup_history():
    a = noisy(1.0)
    a[3, 0] = 1e4                   # before `warmup` steps of history: not judged
    trace = build([("a", "other")], {"act_absmax": a})
    assert [e.step for e in of(detect(trace)[1], "regime_shift")] == []


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_layer_whose_output_becomes_exactly_zero_is_a_collapse(chunk):
    # "ln" (a LayerNorm whose weight and bias were zeroed) outputs 0 from step 30, after
    # a step it was not called (NaN); "relu", without parameters, outputs 0 at steps 20-25
    # (all its units off: dead units are judged apart); "lora_b" is 0 until step 12, as
    # a zero-initialised layer is; "gone" is 0 from step 40 after 25 steps unmeasured
    a = noisy(4.0, cols=4)
    a[30:, 0] = 0.0
    a[29, 0] = np.nan
    a[20:26, 1] = 0.0
    a[:12, 2] = 0.0
    a[15:40, 3] = np.nan
    a[40:, 3] = 0.0
    layers = [("ln", "other"), ("relu", "relu", False), ("lora_b", "other"), ("gone", "other")]
    cols = {"act_absmax": a, "param_norm": np.ones((N, 4)), "update_ratio": noisy(1e-3, cols=4)}
    _, events = detect(build(layers, cols))
    loud = [(e.layer, e.step, e.severity) for e in events if e.severity != "info"]
    assert loud == [("ln", 30, "error")]
    zero = of(events, "regime_shift", "ln")[0]
    assert zero.message == f"ln (Linear): activations (abs-max) became exactly 0 at step 30 " \
                           f"(was {a[28, 0]:.3g})"
    assert zero.end is None
    _, det, _ = live_scan(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_gradient_that_falls_for_one_step_is_the_batch_not_a_regime_shift(chunk):
    # a mixture of experts: an expert routed one easy token has its gradient fall 1000x
    # for that step, and one routed no token at the next steps has none (NaN); a layer
    # whose gradient falls and stays down has collapsed, from the step it began;
    # activations jump loudly at once
    g = noisy(1e-2, cols=4)
    g[30, 0] = 1e-5                 # one step: the batch
    g[30:, 1] = 1e-5                # from step 30 on: a collapse
    g[30:32, 2] = 1e-5              # two steps: a collapse that ended
    g[30, 3] = 1e-5                 # one step, then three without a gradient
    g[31:34, 3] = np.nan
    a = noisy(1.0, cols=4)
    a[30, 0] = 1e3
    layers = [("expert", "other"), ("dead", "other"), ("brief", "other"), ("idle", "other")]
    cols = {"grad_norm": g, "act_absmax": a, "param_norm": np.ones((N, 4)),
            "update_ratio": noisy(1e-3, cols=4)}
    scalars = {"loss": noisy(1.0, seed=3)[:, 0]}
    _, events = detect(build(layers, cols, scalars))
    found = [(e.layer, e.step, e.severity) for e in of(events, "regime_shift", signal="gradient")]
    assert found == [("dead", 30, "warning"), ("brief", 30, "warning")]
    assert [(e.layer, e.step) for e in of(events, "regime_shift", signal="activation")] == [
        ("expert", 30)]
    _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_gradients_shrinking_with_a_loss_that_fell_tenfold_are_convergence(chunk):
    # L-BFGS after Adam: at step 40 the loss falls 60x and every gradient 1000x with it;
    # the same gradients falling with a loss that stays is a collapse (a warning)
    g = noisy(1e-1, cols=2)
    g[40:, :] *= 1e-3
    layers = [("a", "other"), ("b", "other")]
    cols = {"grad_norm": g, "param_norm": np.ones((N, 2)), "update_ratio": noisy(1e-3, cols=2)}
    for fell, expected in ((True, []), (False, [(40, "a"), (40, "b")])):
        loss = noisy(1.5e-3, seed=3)[:, 0]
        if fell:
            loss[40:] = 2.5e-5
        _, events = detect(build(layers, cols, {"loss": loss}))
        found = [(e.step, e.layer) for e in of(events, "regime_shift", signal="gradient")
                 if e.severity == "warning"]
        assert found == expected
        _, det, _ = live_scan(layers, cols, {"loss": loss}, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_gradient_jump_that_holds_is_found_though_it_raises_its_own_baseline(chunk):
    # "zeroed": a conv layer whose weights were zeroed at step 30: its gradient, about 0.2
    # and noisy, read 536, 88, 39 (2300x, 380x, 170x its level): judged against its own
    # history, step 31's baseline holds step 30's spike, whose spread would hide the steps
    # after it; "spike" jumps for one step only (the batch); "jump" jumps 200x and is
    # 30x above its level the step after: the warning does not hold, and an info that
    # starts a step later does not either
    g = noisy(0.2, cols=3, sigma=0.3, seed=5)
    g[30:34, 0] = [536.0, 88.0, 39.0, 18.0]
    g[30, 1] = 536.0
    g[30:32, 2] = [0.2 * 200, 0.2 * 30]
    layers = [("zeroed", "other"), ("spike", "other"), ("jump", "other")]
    cols = {"grad_norm": g, "act_absmax": noisy(1.0, cols=3), "param_norm": np.ones((N, 3)),
            "update_ratio": noisy(1e-3, cols=3)}
    scalars = {"loss": noisy(1.0, seed=3)[:, 0]}
    _, events = detect(build(layers, cols, scalars))
    found = [(e.layer, e.step, e.severity) for e in of(events, "regime_shift", signal="gradient")]
    assert found == [("zeroed", 30, "warning")]
    assert "jumped" in of(events, "regime_shift", "zeroed")[0].message
    _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, 120])
def test_a_layer_replaced_inside_the_watch_is_judged_against_its_own_history(chunk):
    """A head at 0.003 (fitted) replaced at step 60 by a new one at 1.5: under the same
    name, the new module's gradient and output are judged from its arrival on against
    their own history (`LayerInfo.since`), not as a 500x jump of the old one's; a jump
    of the old head before it is still found, and so is one of the new head later."""
    M = 120
    grad = noisy(0.003, n=M)
    grad[60:] = noisy(1.5, n=M - 60, seed=4)
    grad[30] = 3.0   # the old head's own jump, held one more step
    grad[31] = 3.0
    grad[90:] *= 300  # the new head's
    layers = [("fc", "other")]
    cols = {"grad_norm": grad, "act_absmax": noisy(1.0, n=M), "param_norm": noisy(1.0, n=M),
            "update_ratio": noisy(1e-3, n=M)}
    scalars = {"loss": noisy(1.0, n=M)[:, 0]}
    found = {}
    for since in (0, 60):
        trace = build(layers, cols, scalars, n=M)
        trace.update_layer(0, since=since)
        found[since] = [e.step for e in of(detect(trace)[1], "regime_shift", "fc", "gradient")]
        streamed = live_scan(layers, cols, scalars, chunk, since={0: since})[2]
        assert sorted(e.step for e in streamed if e.kind == "regime_shift") == found[since]
    assert found == {0: [30, 60, 90], 60: [30, 90]}
