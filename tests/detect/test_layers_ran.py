"""Which layers ran (`detect.ran`): measured at the hooked steps, carried over the steps
between; a frozen layer is said at its step under sampled hooks as under every-step
ones."""

from __future__ import annotations

import numpy as np
from traces import build

from neuraldbg_nb.detect import detect
from neuraldbg_nb.detect.ran import hooked, ran

LAYERS = [("a", "other"), ("b", "other")]


def _sparse(n: int, every: int, stop_b: int | None = None):
    """Activations measured every `every` steps (NaN between), layer b not running from
    `stop_b` on; gradients every step."""
    act = np.full((n, 2), np.nan)
    on = np.arange(n) % every == 0
    act[on] = 1.0
    if stop_b is not None:
        act[stop_b:, 1] = np.nan
    return act, on.astype(float)


def test_a_layer_runs_on_the_unhooked_steps_as_at_the_last_hooked_one():
    act, on = _sparse(12, 4, stop_b=8)
    t = build(LAYERS, {"act_absmax": act, "grad_norm": np.ones((12, 2))}, {"hooked": on}, n=12)
    got = ran(t, 0, 12)
    assert got[:, 0].all()
    assert got[:8, 1].all() and not got[8:, 1].any()
    np.testing.assert_array_equal(ran(t, 5, 12), got[5:])  # a later range reads back
    assert hooked(t, 0, 12).tolist() == (on == 1).tolist()


def test_a_trace_without_the_hooked_column_was_hooked_throughout():
    act = np.ones((6, 2))
    act[3:, 1] = np.nan
    t = build(LAYERS, {"act_absmax": act, "grad_norm": np.ones((6, 2))}, n=6)
    assert hooked(t, 0, 6).all()
    assert ran(t, 0, 6)[:, 1].tolist() == [True] * 3 + [False] * 3


def test_a_layer_frozen_between_hooked_steps_is_said_there():
    n, frozen = 80, 30
    act, on = _sparse(n, 4)
    grad = np.ones((n, 2))
    grad[frozen:, 1] = np.nan  # no gradient from step 30: requires_grad off
    t = build(LAYERS, {"act_absmax": act, "grad_norm": grad}, {"hooked": on}, n=n)
    said = [e for e in detect(t)[1] if e.signal == "frozen"]
    assert [(e.layer, e.step) for e in said] == [("b", frozen)], said
