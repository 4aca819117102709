"""Detectors on hand-made traces: patience, hysteresis, non-finite values that never
recover, regime shifts against a layer's own history, the seed's exploding-gradient rule,
and the promise that a live (incremental) detection and a re-classification give exactly
the events of a one-go `detect(trace)`."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from models import mlp, train

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import Detection, baseline, detect, first_failure
from neuraldbg_nb.detect.baseline import BaselineCache
from neuraldbg_nb.detect.regime import GRADIENT_PATIENCE
from neuraldbg_nb.detect.scan import HOLD, OK, WARNING, last_ok_rows
from neuraldbg_nb.detect.wake import SampledWake, jump_held, rise_held, wake
from neuraldbg_nb.live.captures import CaptureStore
from neuraldbg_nb.live.scans import ScanSchedule
from neuraldbg_nb.trace import LAYER_COLUMNS, Trace

N = 60


def build(layers: list[tuple], cols: dict[str, np.ndarray],
          scalars: dict[str, np.ndarray] | None = None, n: int = N) -> Trace:
    """A trace of n steps; cols are (n, layers) arrays, scalars (n,) arrays. Layers are
    (name, role), or (name, role, has_params) for one without parameters of its own, or
    (name, role, has_params, params) with the number of its own parameters."""
    t = Trace()
    for name, role, *owned in layers:
        t.add_layer(name, "Linear", role, owned[0] if owned else True,
                    params=owned[1] if owned[1:] else -1)
    for s in range(n):
        t.append({c: np.asarray(v[s], np.float32) for c, v in cols.items()},
                 {c: float(v[s]) for c, v in (scalars or {}).items()})
    return t


def noisy(level: float, n: int = N, cols: int = 1, sigma: float = 0.05, seed: int = 0):
    """A level with a little multiplicative noise (log-normal), as real traces have."""
    rng = np.random.default_rng(seed)
    return level * np.exp(sigma * rng.standard_normal((n, cols)))


def of(events, kind=None, layer="any", signal=None):
    return [e for e in events if (kind is None or e.kind == kind)
            and (layer == "any" or e.layer == layer)
            and (signal is None or e.signal == signal)]


def key(e) -> tuple:
    """An event as comparable data, bit for bit (NaN == NaN)."""
    f = lambda x: "nan" if isinstance(x, float) and math.isnan(x) else x
    return tuple(f(v) for v in e.to_dict().values())


def same(e) -> tuple:
    """An event as comparable data, its numbers to 12 significant digits: the same event
    (step, layer, kind, severity, message, signal, end, order), whatever the last bits of
    floating-point summation order."""
    f = lambda x: float(f"{x:.12g}") if isinstance(x, float) and not math.isnan(x) else (
        "nan" if isinstance(x, float) else x)
    return tuple(f(v) for v in e.to_dict().values())


# -- patience ---------------------------------------------------------------------------------
def test_vanishing_needs_patience_and_is_reported_at_its_first_step():
    g = noisy(1e-2, cols=2)
    g[25, 0] = 1e-8                 # one-step dip: not vanishing
    g[40:42, 0] = 1e-8              # two steps: still not (patience 3)
    g[30:33, 1] = 1e-8              # three steps: vanishing, from step 30
    trace = build([("a", "other"), ("b", "other")], {"grad_norm": g})
    _, events = detect(trace)
    assert of(events, "vanishing_gradient", "a") == []
    van = of(events, "vanishing_gradient", "b")
    assert len(van) == 1
    assert van[0].step == 30 and van[0].severity == "error"
    assert van[0].value == pytest.approx(1e-8, rel=1e-3)
    assert van[0].end == 33          # back to healthy at step 33
    rec = of(events, "recovery", "b")
    assert [e.step for e in rec] == [33]


def test_patience_is_a_threshold_setting():
    g = noisy(1e-2, cols=1)
    g[30:32, 0] = 1e-8
    trace = build([("a", "other")], {"grad_norm": g})
    assert of(detect(trace)[1], "vanishing_gradient") == []
    found = of(detect(trace, ndbg.Thresholds(patience=2))[1], "vanishing_gradient")
    assert [e.step for e in found] == [30]


# -- exploding gradients: the seed's rule -------------------------------------------------------
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
        _, det, _ = _live(layers, cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]


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


# -- non-finite: never healthy, never a recovery -------------------------------------------------
def test_nonfinite_is_never_a_recovery():
    a = noisy(1.0, cols=2)
    g = noisy(0.1, cols=2, seed=3)
    loss = noisy(1.0)[:, 0]
    a[30, 0] = np.inf               # one non-finite step, then finite again
    g[35, 1] = np.inf
    loss[40] = np.inf
    trace = build([("a", "other"), ("b", "other")], {"act_absmax": a, "grad_norm": g},
                  {"loss": loss})
    states, events = detect(trace)
    act = of(events, "nonfinite_activation")
    assert [(e.step, e.layer, e.severity, e.end) for e in act] == [(30, "a", "error", None)]
    grad = of(events, "nonfinite_gradient")
    assert [(e.step, e.layer, e.end) for e in grad] == [(35, "b", None)]
    lossev = of(events, "loss_nonfinite")
    assert [(e.step, e.layer, e.end) for e in lossev] == [(40, None, None)]
    assert of(events, "recovery") == []
    dense = states.dense()
    assert (dense[30:, 0] == 3).all() and (dense[:30, 0] == 1).all()
    assert (dense[35:, 1] == 3).all()


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
    _, det, _ = _live(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


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
    _, det, _ = _live(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_nan_in_the_trace_means_not_measured_not_healthy():
    """Unmeasured steps hold the state: a sampled column that is NaN between samples
    neither ends a condition nor starts one."""
    d = np.full((N, 1), np.nan)
    d[::5, 0] = 0.1
    d[30::5, 0] = 0.95              # from step 30 on, every sample is dead
    trace = build([("r", "relu")], {"dead_frac": d})
    _, events = detect(trace)
    dead = of(events, "dead_units")
    assert [(e.step, e.severity) for e in dead] == [(30, "error")]
    assert dead[0].end is None
    assert of(events, "recovery") == []


# -- regime shifts against the layer's own history ---------------------------------------------
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
    _, det, _ = _live(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_slow_drift_is_not_a_regime_shift():
    a = (1.1 ** np.arange(N))[:, None] * noisy(1.0, seed=7)   # x1.1 per step: 300x in all
    trace = build([("drift", "other")], {"act_absmax": a})
    assert of(detect(trace)[1], "regime_shift") == []


def test_regime_shift_needs_warmup_history():
    a = noisy(1.0)
    a[3, 0] = 1e4                   # before `warmup` steps of history: not judged
    trace = build([("a", "other")], {"act_absmax": a})
    assert [e.step for e in of(detect(trace)[1], "regime_shift")] == []


# -- hysteresis --------------------------------------------------------------------------------
def test_value_hovering_at_the_threshold_gives_one_event():
    g = noisy(1.0, cols=1)
    g[20:41, 0] = [1010.0, 990.0] * 10 + [1010.0]   # hovering around explode=1e3
    trace = build([("a", "other")], {"grad_norm": g})
    _, events = detect(trace)
    exp = of(events, "exploding_gradient")
    assert [(e.step, e.end) for e in exp] == [(20, 41)]
    assert [e.step for e in of(events, "recovery", "a", "gradient")] == [41]


def test_dead_units_hovering_at_the_threshold_give_one_event():
    d = np.full((N, 1), 0.1)
    d[20:48, 0] = [0.55, 0.55, 0.55, 0.3] * 7        # held 3 steps, then one healthy dip
    trace = build([("r", "relu")], {"dead_frac": d})  # healthy (0.1) again from step 48
    _, events = detect(trace)
    dead = of(events, "dead_units")
    # one event; it ends where the lasting health began (the dip at 47 that went on)
    assert [(e.step, e.severity, e.end) for e in dead] == [(20, "warning", 47)]


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
        _, det, _ = _live([("r", "relu"), ("s", "relu")], cols, {"loss": np.ones(N)},
                          chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]


def test_dead_units_just_below_the_threshold_neither_start_nor_end_a_condition():
    d = np.full((N, 1), 0.1)
    d[20:45, 0] = [0.52, 0.47, 0.45, 0.51, 0.43] * 5  # wanders across 0.5, never below 0.4
    d[52:58, 0] = 0.45                                # just below the line, from healthy
    trace = build([("r", "relu")], {"dead_frac": d})  # healthy (0.1) at 45-51 and from 58
    _, events = detect(trace)
    dead = of(events, "dead_units")
    assert [(e.step, e.severity, e.end) for e in dead] == [(20, "warning", 45)]
    assert [e.step for e in of(events, "recovery", "r")] == [45]


# -- incremental detection, reclassification -----------------------------------------------------


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
    # zero_init_residual); before, the band's steps counted as "vanishing" ones
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
    _, det, _ = _live(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_wake_fires_on_each_sudden_change_and_not_on_ordinary_moves() -> None:
    """The live scan's trigger (`wake`), on the newest step of three as the live trace
    holds them (the weight norm after the newest update is not there yet, so weights are
    compared one step back): every kind of sudden change wakes it, a move below the
    half-jump line (gradients: half of `jump_error`) does not, nor does a falling loss."""
    th = ndbg.Thresholds()  # wake_jump sqrt(10) = 3.16; gradients 10; the loss 3.16, up
    base = {"act_absmax": 2.0, "param_norm": 5.0, "grad_norm": 0.1}
    scal = {"loss": 1.0, "in_absmax": 3.0, "in_nonfinite": 0.0}

    def woke(col: str, value: float, before: float | None = None) -> frozenset[str]:
        cols = {c: np.full((3, 2), v) for c, v in base.items()}
        cols["param_norm"][2] = np.nan  # set when the next step closes
        scalars = {c: np.full(3, v) for c, v in scal.items()}
        target = cols[col] if col in cols else scalars[col]
        newest = 1 if col == "param_norm" else 2
        if before is not None:
            target[newest - 1, ...] = before
        target[newest, ...] = value
        return wake(build([("a", "other"), ("b", "other")], cols, scalars, n=3), th)

    assert not wake(build([("a", "other")], {c: np.full((1, 1), v) for c, v in base.items()},
                          n=1), th), "one step: nothing to compare"
    assert not woke("act_absmax", 2.0 * 3.1) and woke("act_absmax", 2.0 * 3.2)
    assert not woke("act_absmax", 2.0 / 3.1) and woke("act_absmax", 2.0 / 3.2)
    assert woke("act_absmax", 0.0) and woke("act_absmax", math.inf)
    assert not woke("act_absmax", math.nan), "NaN in the trace: not measured (non-finite is inf)"
    # moves from and to zero and inf, read as numpy divides (x / 0 = inf, 0 / 0 = NaN)
    assert woke("act_absmax", 1.0, before=0.0) and not woke("act_absmax", 0.0, before=0.0)
    assert woke("act_absmax", math.inf, before=math.nan), "a layer first measured non-finite"
    assert woke("act_absmax", 2.0, before=math.inf) and not woke("act_absmax", math.inf,
                                                                 before=math.inf)
    assert not woke("grad_norm", 0.1 * 9.0) and woke("grad_norm", 0.1 * 11.0)
    assert woke("grad_norm", 5e-7, before=2e-6), "crossing the vanish line"
    assert not woke("grad_norm", 5e-7, before=8e-7), "already below it"
    assert woke("grad_norm", 2e3, before=9e2) and not woke("grad_norm", 3e3, before=2e3)
    assert woke("param_norm", 5.0 * 3.2) and not woke("param_norm", -5.0)
    assert woke("param_norm", math.inf), "weights gone non-finite in the last update"
    assert woke("loss", 1.0 * 3.2) and not woke("loss", 1.5)
    assert not woke("loss", 1.0 / 5.0), "a falling loss is no failure"
    assert woke("loss", math.inf)
    assert woke("in_nonfinite", 7.0) and not woke("in_nonfinite", 7.0, before=3.0)
    assert woke("in_absmax", 0.0), "an all-zero batch"
    # a sudden event is scanned for at once; a slow one (reported once it has held) also
    # `patience` steps later; a gradient's jump and the loss's rise, if they held
    assert woke("act_absmax", 0.0) == woke("param_norm", math.inf) == {"sudden"}
    assert woke("grad_norm", 2e3, before=9e2) == woke("loss", math.inf) == {"sudden"}
    assert woke("grad_norm", 5e-7, before=2e-6) == {"slow"}
    assert woke("grad_norm", 0.1 * 11.0) == {"jump"} and woke("loss", 3.2) == {"rise"}


def _blips(seed: int, n: int = 70) -> tuple[np.ndarray, np.ndarray]:
    """A loss near its minimum and two layers' gradients, noisy, with jumps of 3-60x
    (up, and for gradients also down) that last 1-3 steps: what a run that has nearly
    fitted its data looks like, and now and then a jump that holds long enough to be
    reported."""
    rng = np.random.default_rng(seed)
    loss = 0.01 * np.exp(0.3 * rng.standard_normal(n))
    grad = 0.1 * np.exp(0.3 * rng.standard_normal((n, 2)))
    for _ in range(6):
        at, length, factor = int(rng.integers(25, n - 4)), int(rng.integers(1, 4)), \
            float(rng.uniform(3.0, 60.0))
        loss[at:at + length] *= factor
        col = int(rng.integers(0, 2))
        grad[at:at + length, col] *= factor if rng.random() < 0.7 else 1 / factor
    return loss, grad


def test_a_rise_or_jump_whose_scan_is_skipped_is_one_no_scan_would_report() -> None:
    """The live run scans again where the loss rose (`patience` steps later) or a gradient
    jumped (`GRADIENT_PATIENCE` - 1 steps later) only if it held (`rise_held`,
    `jump_held`). Those tests may let a scan be skipped only where it would have found
    nothing: on traces with jumps that last 1-3 steps, wherever a scan at the confirming
    step reports a loss divergence or a gradient regime shift that began at the woken
    step (or, for the loss, the step before it), the test said it held. And they do skip
    the blips."""
    th = ndbg.Thresholds()
    layers = [("a", "other"), ("b", "other")]
    said = {"rise": [], "jump": []}
    for seed in range(12):
        loss, grad = _blips(seed)
        n = len(loss)
        cols, scalars = {"grad_norm": grad, "act_absmax": np.ones((n, 2))}, {"loss": loss}
        prefix = functools.partial(build, layers, cols, scalars)  # prefix(n=k): k steps
        for s in range(th.window, n - th.patience):
            woke = wake(prefix(n=s + 1), th)
            for reason, later, held, kind, signal, starts in (
                    ("rise", th.patience, rise_held, "loss_divergence", "loss", (s - 1, s)),
                    ("jump", GRADIENT_PATIENCE - 1, jump_held, "regime_shift", "gradient",
                     (s,))):
                if reason not in woke:
                    continue
                trace = prefix(n=s + later + 1)
                _, events = detect(trace, th)
                reported = any(e.step in starts for e in of(events, kind, signal=signal))
                answer = held(trace, th, s)
                assert answer or not reported, (seed, s, reason)
                said[reason].append((answer, reported))
    for reason, answers in said.items():
        assert any(r for _, r in answers), f"{reason}: some held and were reported"
        assert sum(not a for a, _ in answers) >= len(answers) // 3, \
            f"{reason}: the blips that fell back at once are skipped"


def test_the_scan_schedule_confirms_a_rise_that_held_and_not_a_blip() -> None:
    """A loss 20x up for one step wakes no second scan `patience` steps later; one that
    stays up does, at that step (its divergence is reported there)."""
    th = ndbg.Thresholds()
    for length, scans_then in ((1, False), (5, True)):
        loss = np.full(40, 0.5)
        loss[30:30 + length] = 10.0
        cols = {"grad_norm": np.full((40, 1), 0.1), "act_absmax": np.ones((40, 1))}
        schedule, det = ScanSchedule(th), Detection(th)
        schedule.interval = 1000  # no batch scan: only the schedule's reasons count
        due = {}
        for k in range(1, 40):
            det.steps_done = k - 1  # the newest step pending
            due[k - 1] = schedule.due(build([("a", "other")], cols, {"loss": loss}, n=k), det)
        assert due[30] is False, "a rise is not a sudden event"
        assert due[30 + th.patience] is scans_then, length


def test_the_scan_schedule_confirms_a_gradient_jump_that_held_at_its_second_step() -> None:
    """A gradient 30x up for one step wakes no scan (its regime shift needs two steps);
    one that stays up wakes one at its second step, which reports it there."""
    th = ndbg.Thresholds()
    for length, scans_then in ((1, False), (5, True)):
        grad = noisy(0.1, n=40)
        grad[30:30 + length] *= 30.0
        cols = {"grad_norm": grad, "act_absmax": np.ones((40, 1))}
        scalars = {"loss": np.ones(40)}
        schedule, det = ScanSchedule(th), Detection(th)
        schedule.interval = 1000  # no batch scan: only the schedule's reasons count
        due = {}
        for k in range(1, 40):
            det.steps_done = k - 1  # the newest step pending
            due[k - 1] = schedule.due(build([("a", "other")], cols, scalars, n=k), det)
        assert due[30] is False, "a gradient's jump alone is not a sudden event"
        assert due[31] is scans_then, length
        if scans_then:
            _, events = detect(build([("a", "other")], cols, scalars, n=32), th)
            assert [e.step for e in of(events, "regime_shift", signal="gradient")] == [30]


def test_sampled_wake_fires_on_a_new_condition_not_on_a_layer_at_the_line() -> None:
    """Dead units are judged on sampled steps only, against the two samples before: a
    layer that crosses the line after two samples below it wakes the scan; one that flips
    across it from sample to sample (half-dead ReLUs in a deep stack) does not every time."""
    th = ndbg.Thresholds()  # dead 0.5
    w = SampledWake()
    flags = []
    for dead in [0.1, 0.1, 0.2, 0.7, 0.7, 0.2, 0.6, 0.3, 0.6, 0.1, 0.1, 0.8]:
        t = build([("relu", "relu")], {"dead_frac": np.full((1, 1), dead)},
                  {"sampled": np.ones(1)}, n=1)
        flags.append(bool(w(t, th)))
    assert flags == [False, False, False, True, False, False, False, False, False, False,
                     False, True]
    unsampled = build([("relu", "relu")], {"dead_frac": np.full((1, 1), 0.9)},
                      {"sampled": np.zeros(1)}, n=1)
    assert not SampledWake()(unsampled, th), "a step that was not sampled is not judged"
    first = build([("relu", "relu")], {"dead_frac": np.full((1, 1), 0.9)},
                  {"sampled": np.ones(1)}, n=1)
    assert SampledWake()(first, th), "the first sample is judged on its own"


def rich_trace() -> tuple[list[tuple[str, str]], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Several events of several kinds in one trace."""
    n, L = 120, 4
    layers = [("in", "other"), ("relu", "relu"), ("tanh", "bounded"), ("out", "other")]
    rng = np.random.default_rng(11)
    jitter = lambda lvl: lvl * np.exp(0.1 * rng.standard_normal((n, L)))
    g = jitter(0.1)
    g[25:29, 2] = 1e-8                              # vanishing at step 25
    g[50, 3] = 5e4                                  # exploding at 50
    g[100:, 0] = np.inf                             # non-finite gradient at 100
    a = jitter(2.0)
    a[70:, 1] *= 300                                # activation jump at 70
    a[100:, 0] = np.inf                             # non-finite activation at 100
    pn = jitter(5.0) * 0 + 5.0 + np.cumsum(np.full((n, L), 0.001), 0)
    pn[60:, 3] *= 3.0                               # weights tripled in the update of 60
    upd = np.full((n, L), np.nan)
    upd[::10] = 1e-3
    upd[60::10, 0] = 0.0                            # layer 0 left out of the optimizer
    pn[59:, 0] = pn[59, 0]                          # from step 60
    dead = np.full((n, L), np.nan)
    dead[::5, 1] = 0.1
    dead[80::5, 1] = 0.7                            # dead units from 80
    sat = np.full((n, L), np.nan)
    sat[::5, 2] = 0.05
    sat[40:45, 2] = 0.9                             # saturation 40..44
    loss = 1.0 * np.exp(0.05 * rng.standard_normal(n))
    loss[90:93] = 50.0                              # divergence at 90
    lr = np.full(n, 0.1)
    lr[85:] = 10.0                                  # learning rate raised at 85
    in_absmax = 3.0 * np.exp(0.05 * rng.standard_normal(n))
    in_absmax[33] = 3e4                             # a shifted batch at 33
    in_nonfinite = np.zeros(n)
    in_nonfinite[110] = 4.0                         # a batch with NaNs at 110
    eval_layers = np.zeros(n)
    eval_layers[15:22] = 2.0                        # trained in eval mode 15..21
    eval_layers[18] = np.nan                        # (a step without a backward)
    grad_carried = np.zeros(n)
    grad_carried[113:116] = 1.0                     # gradients not zeroed 113..115
    grads_missing = np.zeros(n)
    grads_missing[117:] = 1.0                       # none at the step from 117
    cols = {"grad_norm": g, "act_absmax": a, "param_norm": pn, "update_ratio": upd,
            "dead_frac": dead, "sat_frac": sat}
    scalars = {"loss": loss, "lr": lr, "in_absmax": in_absmax, "in_nonfinite": in_nonfinite,
               "in_const": np.zeros(n), "in_repeat": np.zeros(n), "eval_layers": eval_layers,
               "grad_carried": grad_carried, "grads_missing": grads_missing}
    return layers, cols, scalars


def _live(layers, cols, scalars, chunk: int = 1, th=None):
    """Rebuild the trace the way the probe does (a step's weight norm and update size are
    filled in one step late) and advance a Detection every `chunk` steps."""
    late = ("param_norm", "update_ratio")
    n = len(scalars["loss"])
    t = Trace()
    for name, role, *owned in layers:
        t.add_layer(name, "Linear", role, owned[0] if owned else True,
                    params=owned[1] if owned[1:] else -1)
    det = Detection(th or ndbg.Thresholds())
    streamed = []
    for s in range(n):
        if s > 0:
            for c in late:
                t.set_layer_values(c, s - 1, cols[c][s - 1].astype(np.float32))
        t.append({c: v[s].astype(np.float32) for c, v in cols.items() if c not in late},
                 {c: float(v[s]) for c, v in scalars.items()})
        if (s + 1) % chunk == 0 or s == n - 1:
            streamed += det.advance(t)
    for c in late:  # the probe's flush at exit
        t.set_layer_values(c, n - 1, cols[c][n - 1].astype(np.float32))
    return t, det, streamed


@pytest.mark.parametrize("chunk", [1, 7])
def test_incremental_detection_equals_detect_in_one_go(chunk):
    layers, cols, scalars = rich_trace()
    full = build(layers, cols, scalars, n=len(scalars["loss"]))
    _, events = detect(full)
    kinds = {e.kind for e in events}
    for k in ("vanishing_gradient", "exploding_gradient", "nonfinite_gradient",
              "nonfinite_activation", "regime_shift", "dead_units", "saturation",
              "exploding_update", "data_anomaly", "loss_divergence", "lr_change",
              "eval_mode", "weights_not_updated", "grads_not_zeroed", "no_gradients"):
        assert k in kinds, f"the test trace should produce {k}; got {sorted(kinds)}"
    t, det, streamed = _live(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]
    # what was handed out step by step is the same set (ends are filled in later)
    strip = lambda e: same(e)[:-2]
    assert sorted(map(strip, streamed)) == sorted(
        strip(e) for e in events), "advance() returned other events than detect()"
    for name in LAYER_COLUMNS:
        np.testing.assert_array_equal(t.col(name), full.col(name))


@pytest.mark.parametrize("changes", [{"jump": 5.0, "patience": 2},
                                     {"vanish": 1e-9, "explode": 1e5},
                                     {"window": 8, "warmup": 3, "max_update": 0.5}])
def test_incremental_detection_equals_detect_under_other_thresholds(changes):
    layers, cols, scalars = rich_trace()
    th = ndbg.Thresholds(**changes)
    full = build(layers, cols, scalars, n=len(scalars["loss"]))
    _, events = detect(full, th)
    _, det, _ = _live(layers, cols, scalars, chunk=1, th=th)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_incremental_detection_is_bit_exact():
    """The design promises the live (chunked) scan and the one-go scan give the *same*
    events: the numbers in them included, not only to rounding."""
    layers, cols, scalars = rich_trace()
    full = build(layers, cols, scalars, n=len(scalars["loss"]))
    _, events = detect(full)
    _, det, _ = _live(layers, cols, scalars, chunk=1)
    diffs = [(a.step, a.layer, a.kind, a.signal, "previous", a.previous, b.previous)
             for a, b in zip(det.events, events) if key(a) != key(b)]
    assert len(det.events) == len(events)
    assert not diffs, f"{len(diffs)} events differ in their numbers, e.g. {diffs[:3]}"


def _faulty_mlp_run(**watch_kw):
    """overhead=None: the full statistics exactly every 10 steps, so that two trainings
    record the same trace (the default budget samples by wall time)."""
    setup = mlp()
    watch_kw.setdefault("overhead", None)

    def hit(step, model, opt):
        if step in (40, 55):
            with torch.no_grad():
                model[2].weight.mul_(30.0)
    with ndbg.watch(setup.model, report=False, **watch_kw) as run:
        train(setup, 70, on_step_start=hit)
    return run


@pytest.mark.parametrize("changes", [{"jump": 5.0, "jump_error": 20.0, "patience": 2},
                                     {"explode": 50.0, "window": 10}])
def test_reclassify_equals_a_live_run_with_those_thresholds(changes):
    default = _faulty_mlp_run()
    before = [same(e) for e in default.events]
    live = _faulty_mlp_run(**changes)
    for c in LAYER_COLUMNS:  # the two trainings recorded the same numbers
        np.testing.assert_array_equal(live.trace.col(c), default.trace.col(c))
    again = default.reclassify(**changes)
    assert again.thresholds == live.thresholds
    assert [same(e) for e in again.events] == [same(e) for e in live.events]
    ff_live, ff_again = live.first_failure, again.first_failure
    assert (ff_live is None) == (ff_again is None)
    if ff_live is not None:
        assert same(ff_live) == same(ff_again)
    assert [same(e) for e in default.events] == before, "reclassify changed the original"
    assert [same(e) for e in again.reclassify(ndbg.Thresholds()).events] == before
    # the changes did change something, so the comparison means something
    assert [same(e) for e in again.events] != before


# -- re-classification cache (the panel's sliders) ------------------------------------------------
def _recorded(th=None):
    """A recorded run of the rich trace, as `load` gives it."""
    layers, cols, scalars = rich_trace()
    trace = build(layers, cols, scalars, n=len(scalars["loss"]))
    return ndbg.Run(trace, th or ndbg.Thresholds(), CaptureStore(0))


@pytest.mark.parametrize("first, then", [
    ({"jump": 5.0}, {"jump": 500.0}),  # the 300x activation jump no longer counts
    ({"jump": 50.0}, {"jump": 3.0, "jump_error": 1000.0}),  # ... is only a warning
    ({"jump": 5.0}, {"window": 8, "warmup": 3, "noise": 2.0}),  # other baselines
    ({"jump": 5.0}, {"jump": 0.5}),  # a factor <= 1 flags every step: not kept
])
def test_reclassify_after_a_cached_one_equals_a_fresh_detect(first, then):
    run = _recorded()
    warm = run.reclassify(**first)
    assert len(run._baselines) > 0, "the first reclassify should keep the baselines"
    assert [key(e) for e in warm.events] == [key(e) for e in detect(run.trace, warm.thresholds)[1]]
    again = warm.reclassify(**then)  # from the re-classified run: the same cache
    assert again._baselines is run._baselines
    fresh = detect(run.trace, again.thresholds)[1]  # no cache at all
    assert [key(e) for e in again.events] == [key(e) for e in fresh]
    assert [key(e) for e in again.events] != [key(e) for e in warm.events], \
        "the thresholds should change something, so the comparison means something"
    # and back: the cached entries still give the first answer
    back = again.reclassify(warm.thresholds)
    assert [key(e) for e in back.events] == [key(e) for e in warm.events]


def test_the_reclassify_cache_is_invalidated_when_the_trace_grows_or_is_compacted():
    layers, cols, scalars = rich_trace()
    n = len(scalars["loss"])
    trace = build(layers, cols, scalars, n=n - 20)  # the first n - 20 steps for now
    run = ndbg.Run(trace, ndbg.Thresholds(), CaptureStore(0))
    th = ndbg.Thresholds(jump=5.0)
    run.reclassify(th)
    version = trace.version
    rows = {len(j.judged) for j in run._baselines._entries.values()}
    assert rows == {n - 20}
    for s in range(n - 20, n):  # the run goes on, with a jump in layer 3 at step n - 10
        scale = 1e3 if s >= n - 10 else 1.0
        trace.append({c: np.asarray(v[s] * (scale if c == "act_absmax" else 1.0), np.float32)
                      for c, v in cols.items()}, {c: float(v[s]) for c, v in scalars.items()})
    assert trace.version > version
    grown = run.reclassify(th)
    assert [key(e) for e in grown.events] == [key(e) for e in detect(trace, th)[1]]
    assert any(e.step == n - 10 and e.kind == "regime_shift" for e in grown.events)
    assert {len(j.judged) for j in run._baselines._entries.values()} == {n}, "stale entries"
    # a step filled in late changes the numbers too
    version = trace.version
    trace.set_layer_values("grad_norm", n - 5, np.full(4, 1e4, np.float32))
    assert trace.version > version
    filled = run.reclassify(th)
    assert [key(e) for e in filled.events] == [key(e) for e in detect(trace, th)[1]]
    # compaction: only the exact tail is judged again
    trace.compact(40)
    compacted = run.reclassify(th)
    fresh = Detection(th, start=trace.full_from)
    fresh.advance(trace)
    assert [key(e) for e in compacted.detection.events if e.step >= 39] == \
        [key(e) for e in fresh.events if e.step >= 39]
    assert {len(j.judged) for j in run._baselines._entries.values()} == {n - 40}


def test_the_reclassify_cache_is_bounded():
    run = _recorded()
    for window in range(3, 3 + 3 * BaselineCache.MAX_ENTRIES):
        run.reclassify(window=window, warmup=2)
        assert len(run._baselines) <= BaselineCache.MAX_ENTRIES
    # an entry: 1 byte per layer-step, plus 24 bytes per cell that stands out of the noise
    cells = run.trace.n_steps * run.trace.n_layers
    for jumps in run._baselines._entries.values():
        assert jumps.judged.nbytes == cells and len(jumps.at) < cells / 10
        assert jumps.nbytes == cells + 24 * len(jumps.at)


def test_jumps_are_the_same_in_blocks_of_any_size(monkeypatch):
    layers, cols, scalars = rich_trace()
    trace = build(layers, cols, scalars, n=len(scalars["loss"]))
    whole = [key(e) for e in detect(trace, ndbg.Thresholds(jump=5.0))[1]]
    monkeypatch.setattr(baseline, "BLOCK_CELLS", 1)  # blocks of 8 * window rows
    for th in (ndbg.Thresholds(jump=5.0), ndbg.Thresholds(jump=5.0, window=3)):
        blocks = [key(e) for e in detect(trace, th)[1]]
        monkeypatch.setattr(baseline, "BLOCK_CELLS", 10 ** 9)
        assert blocks == [key(e) for e in detect(trace, th)[1]]
        monkeypatch.setattr(baseline, "BLOCK_CELLS", 1)
    assert [key(e) for e in detect(trace, ndbg.Thresholds(jump=5.0))[1]] == whole


def test_last_healthy_rows_match_a_brute_force_search():
    rng = np.random.default_rng(3)
    for n in (1, 5, 70, 300):
        codes = rng.choice(np.array([HOLD, OK, OK, WARNING], np.int8), (n, 9))
        codes[:, 0] = HOLD                                 # never observed
        codes[:, 1] = OK                                   # healthy to the end
        codes[: n // 2, 2], codes[n // 2:, 2] = OK, WARNING  # healthy long ago
        values = rng.normal(size=(n, 9))
        values[rng.random((n, 9)) < 0.2] = np.nan
        values[-1, 1] = np.nan                             # the last healthy row: NaN
        for cols in (np.arange(9), np.array([1, 2, 5]), np.array([0])):
            want = [max([r for r in range(n) if codes[r, j] == OK
                         and not np.isnan(values[r, j])], default=-1) for j in cols]
            assert last_ok_rows(codes, values, cols).tolist() == want


def test_training_in_eval_mode_is_one_warning_from_its_first_step_to_model_train():
    """The count of dropout/BatchNorm layers in eval mode as backwards start: a warning
    at the first step it is above 0 (no patience: the mode is a fact, not a noisy
    reading), held over a step without a backward (NaN), ended by training mode."""
    eval_layers = np.zeros(N)
    eval_layers[20:35] = 3.0
    eval_layers[25] = np.nan
    t = build([("fc", "other")], {"grad_norm": noisy(0.1)}, {"eval_layers": eval_layers})
    _, events = detect(t)
    (warned,) = of(events, "eval_mode")
    assert (warned.step, warned.layer, warned.severity, warned.end) == (20, None, "warning", 35)
    assert warned.value == 3.0
    assert "3 dropout/BatchNorm layers" in warned.message and "model.train()" in warned.message
    (back,) = [e for e in of(events, "recovery") if e.step == 35]
    assert "back in training mode" in back.message
    assert first_failure(events, ndbg.Thresholds()) is None, "a warning, not a failure"
    quiet = build([("fc", "other")], {"grad_norm": noisy(0.1)}, {"eval_layers": np.zeros(N)})
    assert not of(detect(quiet)[1], "eval_mode")


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
    _, det, _ = _live(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_weights_growing_from_zeros_are_not_an_exploding_update(chunk):
    # "a": zeros before the update of step 0 (the weight probe's ratio is inf there), then
    # SGD with momentum 0.9: each update 1 + 0.9 + ... times the first, so the norm goes
    # 1, 2.9, 5.6, ... (x2.9 in the update of step 1); "b" the same from a norm of 1, an
    # optimizer blow-up; "c" grows from zeros, then is multiplied by 5 in place at step 30
    # (after `GROWING` updates); "d" grows from zeros and goes non-finite at step 3; "e"
    # grows from zeros one step late, under a warm-up whose first learning rate is 0: its
    # first move, at step 1, is not sampled (a LoRA B matrix under Hugging Face's linear
    # warm-up was "changed by 1.84x" at step 2, the run's first failure)
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
    _, det, _ = _live(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_layerscale_gains_growing_from_next_to_nothing_are_not_an_exploding_update():
    # 64 gains initialised at 1e-5 (LayerScale: CaiT, ConvNeXt, DINOv2), then Adam's steps
    # of 5e-5 each: step 0's update is 5x their size ("changed by 5x", the run's first
    # failure), and no norm was read before it (the update's size bounds it). The same
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
def test_a_layer_used_one_step_in_five_is_not_cut_off(chunk):
    # task heads trained in turn, gradients zeroed (not set to None): each head reads
    # exactly 0 four steps in five, and was "cut off" for good; a head that stops being
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
    _, det, _ = _live(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, 60])
def test_an_input_jump_the_model_does_not_feel_is_a_warning(chunk):
    # the input's abs-max jumps 160x at step 30 (a heavy-tailed feature's extreme value
    # under a BatchNorm) and nothing moves: a warning; at step 45 the same jump with the
    # first layer's output 100x (a Linear first): an error; at step 52, with a gradient
    # collapsing 1000x (a tanh RNN saturated, its output bounded): an error
    x = noisy(3e6)[:, 0]
    x[[30, 45, 52]] *= 160
    a = noisy(6.0, cols=2)
    a[45, 0] *= 100
    g = noisy(1e-2, cols=2)
    g[52, 1] *= 1e-3
    layers = [("bn", "other"), ("fc", "other")]
    cols = {"act_absmax": a, "grad_norm": g, "param_norm": np.ones((N, 2)),
            "update_ratio": noisy(1e-3, cols=2)}
    scalars = {"loss": noisy(0.5, seed=3)[:, 0], "in_absmax": x}
    _, events = detect(build(layers, cols, scalars))
    found = [(e.step, e.severity) for e in of(events, "data_anomaly", signal="input_scale")]
    assert found == [(30, "warning"), (45, "error"), (52, "error")]
    _, det, _ = _live(layers, cols, scalars, chunk=chunk)
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
        _, det, _ = _live(layers, cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, 300])
def test_a_risen_loss_is_an_error_near_where_it_started_and_a_jump_is_not_a_climb(chunk):
    # from 1.0 the loss falls to 1e-3 by step 100; at step 150 it jumps 40x (still 27x
    # below its first value: a warning) and hovers; a second run's jumps 400x (0.4: an
    # error) and is not also a climb over 200 steps; a third climbs 10x every 60 steps
    # from step 150 on (a warning, an error from a tenth of where it started)
    n = 400
    fall = np.concatenate([10 ** (-np.arange(100) / 33.3), np.full(n - 100, 1e-3)])
    runs = {"harder": fall.copy(), "diverged": fall.copy(), "climbs": fall.copy()}
    runs["harder"][150:] *= 40
    runs["diverged"][150:] *= 400
    runs["climbs"][150:] *= 10 ** (np.arange(n - 150) / 60)
    cols = {"grad_norm": noisy(1e-2, n=n), "param_norm": np.ones((n, 1)),
            "update_ratio": noisy(1e-3, n=n)}
    found = {}
    for name, loss in runs.items():
        scalars = {"loss": loss * noisy(1.0, n=n, seed=3)[:, 0]}
        _, events = detect(build([("a", "other")], cols, scalars, n=n))
        found[name] = [(e.signal, e.severity) for e in of(events, "loss_divergence")]
        _, det, _ = _live([("a", "other")], cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
        if name == "harder":
            assert events[0].message.endswith("; still 27x below its first value 1.11")
    assert found == {"harder": [("loss", "warning")], "diverged": [("loss", "error")],
                     "climbs": [("loss_trend", "warning"), ("loss_trend", "error")]}


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
        _, det, _ = _live(layers, cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
        if name == "prompt":
            assert "each moved by about the learning rate (0.03)" in events[0].message
    assert found == {"prompt": [(0, "warning")], "slow": [(0, "error")],
                     "huge": [(0, "error")], "late": [(30, "error")]}


@pytest.mark.parametrize("chunk", [1, 7, 400])
def test_an_input_scale_that_drifts_without_a_jump_is_a_warning(chunk):
    # 1.06x a step from step 100 (no step a jump): a warning once its level moved 100x over
    # 200 steps, and the first failure when a layer blows up later while it goes on; a
    # 1000x jump at step 100 is the jump's event, not also a drift; a steady input neither
    n = 400
    cols = {"grad_norm": noisy(1e-2, n=n), "param_norm": np.ones((n, 1)),
            "update_ratio": noisy(1e-3, n=n), "act_absmax": noisy(2.0, n=n)}
    cols["act_absmax"][300:] = np.inf  # the overflow it leads to
    found = {}
    for name, scale in (("drift", 1.06 ** np.clip(np.arange(n) - 100, 0, None)),
                        ("jump", np.where(np.arange(n) < 100, 1.0, 1000.0)),
                        ("steady", np.ones(n))):
        scalars = {"loss": noisy(1.0, n=n, seed=3)[:, 0],
                   "in_absmax": 3.0 * scale * noisy(1.0, n=n, seed=5)[:, 0]}
        _, events = detect(build([("fc", "other")], cols, scalars, n=n))
        found[name] = [(e.signal, e.step, e.severity) for e in of(events, "data_anomaly")]
        _, det, _ = _live([("fc", "other")], cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
        if name == "drift":
            root = first_failure(events, ndbg.Thresholds())
            assert (root.signal, root.step) == ("input_drift", found["drift"][0][1])
            assert "drifted" in root.message and "no step a jump" in root.message
    assert [(sig, sev) for sig, _, sev in found["drift"]] == [("input_drift", "warning")]
    # 100x from about step 190; judged from step 205, when a level 200 steps back exists
    assert found["drift"][0][1] == 205, found["drift"]
    assert found["jump"] == [("input_scale", 100, "warning")]  # (not felt: `data._felt`)
    assert found["steady"] == []


def test_a_learning_rate_moved_by_about_the_jump_factor_is_a_change():
    # StepLR(gamma=0.1) from 0.05: 0.05 * 0.1 is 0.005000000000000001, a factor of 10 that
    # reads 0.9999999999999999 decades; the first decay went unreported. A base rate
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


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_batch_repeated_from_the_first_step_is_info_and_a_stuck_loader_a_warning(chunk):
    cols = {"grad_norm": noisy(1e-2), "param_norm": np.ones((N, 1)),
            "update_ratio": noisy(1e-3)}
    every = np.ones(N)
    every[0] = 0.0                      # full-batch training: each batch is the last one
    stuck = np.zeros(N)
    stuck[30:] = 1.0                    # a loader stuck from step 30 on
    brief = np.zeros(N)
    brief[30:35] = 1.0                  # stuck for five steps, then fed again
    echo = np.ones(N)
    echo[::4] = 0.0                     # each batch used 4 times, from the first
    echo[40:46] = 1.0                   # ... and 10 times from step 36: at step 40 longer than ever
    found = {}
    for name, repeat in [("every", every), ("stuck", stuck), ("brief", brief), ("echo", echo)]:
        scalars = {"loss": np.ones(N), "in_repeat": repeat}
        _, events = detect(build([("a", "other")], cols, scalars))
        _, det, _ = _live([("a", "other")], cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
        found[name] = [(e.step, e.severity, e.end) for e in of(events, "data_anomaly")]
        if name == "every":
            assert "full-batch training" in of(events, "data_anomaly")[0].message
    assert found == {"every": [(1, "info", None)], "stuck": [(30, "warning", None)],
                     "brief": [(30, "warning", 35)], "echo": [(1, "info", 40), (40, "warning", None)]}


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
    _, det, _ = _live(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]
    # near the line at the first step, it moves by less; from below 100, not at all
    g[0] = [900.0, 600.0]
    near = of(detect(build(layers, cols))[1], "exploding_gradient")
    assert "above 9e+03" in near[0].message and near[0].severity == "info"
    g[0] = [90.0, 60.0]
    assert [(e.step, e.layer, e.severity) for e in of(detect(build(layers, cols))[1],
                                                      "exploding_gradient")][:1] == [
        (1, "a", "error")]


def test_the_first_steps_gradient_norms_and_loss_survive_compaction_and_files(tmp_path):
    g = noisy(3e3, cols=2)
    g[0] = [1.8e3, 600.0]
    loss = np.linspace(3.0, 0.1, N)
    loss[0] = np.nan  # the first finite loss is the run's first
    trace = build([("a", "other"), ("b", "other")], {"grad_norm": g}, {"loss": loss})
    trace.compact(40)
    assert list(trace.first_grad_norm) == [1.8e3, 600.0]
    assert trace.first_loss == loss[1]
    trace.save(tmp_path / "t.npz")
    assert list(Trace.load(tmp_path / "t.npz").first_grad_norm) == [1.8e3, 600.0]
    assert Trace.load(tmp_path / "t.npz").first_loss == loss[1]
    # a file saved before they were: read from its first steps where they are still exact
    fresh = build([("a", "other"), ("b", "other")], {"grad_norm": g}, {"loss": loss})
    fresh.save(tmp_path / "old.npz")
    with np.load(tmp_path / "old.npz") as z:
        arrays = {k: z[k] for k in z.files if k not in ("first_grad_norm", "first_loss")}
    np.savez_compressed(tmp_path / "old.npz", **arrays)
    assert list(Trace.load(tmp_path / "old.npz").first_grad_norm) == [1.8e3, 600.0]
    assert Trace.load(tmp_path / "old.npz").first_loss == loss[1]


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
        _, det, _ = _live(layers, cols, {"loss": loss}, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]


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
    _, det, _ = _live(layers, cols, {"loss": np.ones(N)}, chunk=chunk)
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
        found += [e.message.split(": ", 2)[2] for e in of(events, "weights_not_updated")]
        _, det, _ = _live([("fc", "other")], cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
    assert found == ["the learning rate is 0 since step 25 (was 0.001)",
                     "the learning rate is 9.54e-10, down from 1.53e-08 at step 36"]


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


def test_gradients_carried_over_two_steps_in_a_row_are_the_first_failure():
    """A loop without zero_grad: an error from the first step whose gradients still held
    the last step's, held two steps (one such step alone is not enough), and the root
    cause over what it breaks later (a layer's activations jumping)."""
    carried = np.zeros(N)
    carried[0] = np.nan                  # step 0: nothing to compare with
    carried[5] = 1.0                     # one step alone
    carried[20:] = 1.0
    a = noisy(2.0)
    a[40:] *= 300                        # what it breaks, later
    t = build([("fc", "other")], {"act_absmax": a}, {"grad_carried": carried})
    _, events = detect(t)
    (carry,) = of(events, "grads_not_zeroed")
    assert (carry.step, carry.layer, carry.severity, carry.end) == (20, None, "error", None)
    assert "zero_grad()" in carry.message
    assert of(events, "regime_shift", "fc")
    assert first_failure(events, ndbg.Thresholds()) is carry
    th = ndbg.Thresholds()
    woke = [wake(build([("fc", "other")], {"act_absmax": a[:k]}, {"grad_carried": carried[:k]},
                       n=k), th) for k in range(2, 25)]
    assert [k - 1 for k, w in zip(range(2, 25), woke) if "sudden" in w] == [21], \
        "a live run scans at once when the second step in a row is carried over"


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_gradient_jump_that_holds_is_found_though_it_raises_its_own_baseline(chunk):
    # "zeroed": a conv layer whose weights were zeroed at step 30: its gradient, about 0.2
    # and noisy, read 536, 88, 39 (2300x, 380x, 170x its level): judged against its own
    # history, step 31's baseline holds step 30's spike, whose spread hid it, and nothing
    # was said; "spike" jumps for one step only (the batch); "jump" jumps 200x and is
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
    _, det, _ = _live(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


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
    _, det, _ = _live(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]
