"""Mistakes of the training loop (`detect.loop`) on hand-made traces: a model trained in
eval mode, and gradients carried over from step to step (no `zero_grad()`)."""

from __future__ import annotations

import numpy as np
from traces import N, build, noisy, of

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect, first_failure
from neuraldbg_nb.detect.wake import wake


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
