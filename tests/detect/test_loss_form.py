"""A loss given inputs of the wrong form (`detect.loss_form`) on hand-made traces: read on
sampled steps only (NaN between them), an error from the first step it is read at, the
first failure over what it starves later, and quiet where the loss is built right."""

from __future__ import annotations

import numpy as np
from traces import N, build, noisy, of

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect, first_failure
from neuraldbg_nb.trace.columns import SIGMOID_TWICE, SOFTMAX_TWICE


def _sampled(value: float, start: int = 0) -> np.ndarray:
    col = np.full(N, np.nan)
    col[::7] = 0.0
    col[start::7] = value
    col[:start] = np.where(np.isnan(col[:start]), np.nan, 0.0)
    return col


def test_a_squashed_output_given_to_its_loss_is_the_first_failure_from_its_first_read():
    for code, words in ((SOFTMAX_TWICE, "log-softmax to a softmax's output"),
                        (SIGMOID_TWICE, "given a sigmoid's output")):
        grad = noisy(0.1)
        grad[30:] *= 1e-4  # what it starves, later
        t = build([("fc", "other")], {"grad_norm": grad},
                  {"loss_squashed": _sampled(code, start=14), "loss": np.full(N, 2.3)})
        _, events = detect(t)
        (bad,) = of(events, "loss_misuse")
        assert (bad.step, bad.layer, bad.severity, bad.signal) == (14, None, "error",
                                                                   "squashed")
        assert words in bad.message and "(loss 2.3)" in bad.message
        assert first_failure(events, ndbg.Thresholds()) is bad


def test_a_broadcast_regression_loss_says_how_many_targets_each_prediction_meets():
    t = build([("fc", "other")], {"grad_norm": noisy(0.1)},
              {"loss_broadcast": _sampled(64.0), "loss": np.full(N, 0.8)})
    (bad,) = of(detect(t)[1], "loss_misuse")
    assert (bad.step, bad.signal, bad.value) == (0, "broadcast", 64.0)
    assert "with 64 targets" in bad.message and "squeeze(-1)" in bad.message


def test_a_loss_built_right_or_never_read_is_quiet():
    for cols in ({"loss_squashed": _sampled(0.0), "loss_broadcast": _sampled(0.0)},
                 {"loss_squashed": np.full(N, np.nan)}, {}):
        t = build([("fc", "other")], {"grad_norm": noisy(0.1)}, cols)
        assert not of(detect(t)[1], "loss_misuse"), cols


LONG = 200


def _at_chance(n: int = LONG, fall_at: int | None = None) -> dict[str, np.ndarray]:
    chance = np.full(n, np.nan)
    chance[::7] = np.log(10)
    loss = np.log(10) * noisy(1.0, n=n, sigma=0.01)[:, 0]
    if fall_at is not None:
        loss[fall_at:] = 0.3
    loss[50] = np.nan  # a step without a loss does not break the stretch
    return {"loss": loss, "loss_chance": chance, "lr": np.full(n, 0.1)}


def test_a_loss_held_at_chance_is_a_warning_then_an_error_and_says_what_to_check():
    th = ndbg.Thresholds(chance_steps=40)
    grad = noisy(0.1, n=LONG, cols=2)
    t = build([("a", "other"), ("b", "other")], {"grad_norm": grad}, _at_chance(), n=LONG)
    _, events = detect(t, th)
    warned, failed = of(events, "loss_at_chance")
    assert (warned.step, warned.severity, failed.step, failed.severity) == \
        (39, "warning", 79, "error")
    assert "for 40 steps, by step 39" in warned.message and "C = 10 classes" in warned.message
    assert "label belongs to its input" in warned.message
    assert first_failure(events, th) is not None
    # every step's gradients of one total norm: clipped to it
    clipped = grad / np.sqrt((grad ** 2).sum(axis=1, keepdims=True)) * 1e-4
    t = build([("a", "other"), ("b", "other")], {"grad_norm": clipped}, _at_chance(), n=LONG)
    (warned, _) = of(detect(t, th)[1], "loss_at_chance")
    assert "total norm is 0.0001 at every step" in warned.message, warned.message


def test_a_loss_that_leaves_chance_in_time_or_is_not_a_cross_entropy_is_quiet():
    th = ndbg.Thresholds(chance_steps=40)
    for cols in (_at_chance(fall_at=30), {**_at_chance(), "loss_chance": np.full(LONG, np.nan)},
                 {**_at_chance(), "loss_squashed": np.full(LONG, SOFTMAX_TWICE)}):
        t = build([("a", "other")], {"grad_norm": noisy(0.1, n=LONG)}, cols, n=LONG)
        assert not of(detect(t, th)[1], "loss_at_chance")
    fell = _at_chance(fall_at=60)
    t = build([("a", "other")], {"grad_norm": noisy(0.1, n=LONG)}, fell, n=LONG)
    (warned,) = of(detect(t, th)[1], "loss_at_chance")
    # ended once the mean of the last `window` losses fell below chance
    assert (warned.step, warned.severity) == (39, "warning")
    assert 60 < warned.end <= 60 + th.window, warned.end
