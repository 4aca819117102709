"""Detection as a whole (`detect.detection`): a live, incremental detection gives the
events of a one-go `detect(trace)`, bit for bit, under any thresholds; a re-classification
gives the events of a live run with those thresholds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from models import mlp, train
from traces import build, key, live_scan, rich_trace, same

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect
from neuraldbg_nb.trace import LAYER_COLUMNS


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
    t, det, streamed = live_scan(layers, cols, scalars, chunk=chunk)
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
    _, det, _ = live_scan(layers, cols, scalars, chunk=1, th=th)
    assert [same(e) for e in det.events] == [same(e) for e in events]


def test_incremental_detection_is_bit_exact():
    """The design promises the live (chunked) scan and the one-go scan give the *same*
    events: the numbers in them included, not only to rounding."""
    layers, cols, scalars = rich_trace()
    full = build(layers, cols, scalars, n=len(scalars["loss"]))
    _, events = detect(full)
    _, det, _ = live_scan(layers, cols, scalars, chunk=1)
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
