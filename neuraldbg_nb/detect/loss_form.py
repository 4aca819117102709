"""A loss given inputs of the wrong form (`record.loss_form`): cross-entropy on a softmax's
probabilities or on a ReLU's, a sigmoid's or a tanh's outputs,
`binary_cross_entropy_with_logits` on a sigmoid's or a ReLU's, a regression loss whose
prediction was broadcast against a target of another shape. The run trains and the loss
moves, but the model learns slowly, stalls near chance or learns only the targets' mean:
an error from the first step it is read at (sampled steps), so the first failure is the
loss, not the layers it starves."""

from __future__ import annotations

import math

import numpy as np

from ..trace.columns import BOUNDED_LOGITS, SIGMOID_TWICE, Trace
from .scan import ERROR, WARNING, Finding, fmt, grade
from .thresholds import Thresholds


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    squashed = trace.scalar("loss_squashed", lo, stop)[:, None]
    broadcast = trace.scalar("loss_broadcast", lo, stop)[:, None]
    loss = trace.scalar("loss", lo, stop)
    chance = trace.scalar("loss_chance", lo, stop)  # ln(C) where read (sampled steps)

    def floor() -> str:
        """The floor of cross-entropy on probabilities for this run's classes."""
        known = chance[~np.isnan(chance)]
        if not len(known):
            return "(1.46 for 10)"
        c = float(np.exp(known[-1]))
        return f"({fmt(float(np.log1p((c - 1) / np.e)))} for these {c:.0f})"

    def at(s: int) -> str:
        row = s - lo
        return f" (loss {fmt(loss[row])})" if 0 <= row < len(loss) else ""

    def squash_message(name: str, s: int, v: float, p: float, sev: str) -> str:
        if v == SIGMOID_TWICE:
            return (f"the loss is given a sigmoid's output from step {s}{at(s)}: "
                    f"binary_cross_entropy_with_logits applies its own sigmoid, so the "
                    f"probabilities it sees lie in (0.5, 0.73) and the loss cannot fall "
                    f"toward 0. Remove the sigmoid before the loss (BCEWithLogitsLoss takes "
                    f"logits), or use binary_cross_entropy on the probabilities")
        if v in BOUNDED_LOGITS:
            act = BOUNDED_LOGITS[v]
            why = ("they cannot go below 0, and a logit the ReLU zeroes gets no gradient, "
                   "so the model cannot raise it where its class is the right one"
                   if act == "ReLU" else
                   f"they are held inside the {act}'s bounds, so the loss has a floor it "
                   f"cannot fall below")
            return (f"the loss takes its logits from a {act} from step {s}{at(s)}: {why}. "
                    f"Remove the {act} after the output layer: the loss takes raw logits")
        return (f"the loss applies log-softmax to a softmax's output from step {s}{at(s)}: "
                f"cross-entropy takes logits, and given probabilities (each in [0, 1]) its "
                f"loss cannot fall below log(1 + (C - 1) / e) for C classes {floor()} and "
                f"its gradients shrink by the softmax's slope. Remove the softmax before the "
                f"loss (CrossEntropyLoss applies its own), or use nll_loss(torch.log(p))")

    def broadcast_message(name: str, s: int, v: float, p: float, sev: str) -> str:
        return (f"the regression loss compares each prediction with {v:.0f} targets from "
                f"step {s}{at(s)}: the prediction was broadcast against a target of another "
                f"shape (as [N, 1] against [N] makes [N, N]), so the best the model can "
                f"learn is the targets' mean. Give prediction and target the same shape "
                f"(pred.squeeze(-1), or target.view_as(pred))")

    with np.errstate(invalid="ignore"):
        squash_codes = grade(~np.isnan(squashed), (squashed > 0, ERROR))
        broad_codes = grade(~np.isnan(broadcast), (broadcast >= 2, ERROR))
    return [
        Finding("loss_misuse", "squashed", squash_codes, squashed, per_layer=False,
                message=squash_message,
                recovery=lambda n, s, v, p, sev: f"the loss is given logits again at step {s}"),
        Finding("loss_misuse", "broadcast", broad_codes, broadcast, per_layer=False,
                message=broadcast_message,
                recovery=lambda n, s, v, p, sev: f"the regression loss's prediction and "
                                                 f"target have one shape again at step {s}"),
    ]


CHANCE_MARGIN = 0.05
"""A cross-entropy within this share below ln(C), or above it up to `CHANCE_ABOVE`, is at
chance."""

CHANCE_ABOVE = 3.0
"""A cross-entropy above this many times ln(C) is not at chance: it diverged (a model
that learns nothing from its inputs predicts the classes' frequencies, and a confident
wrong guess costs a few ln C at most), which the loss's own events say."""


def chance_history(th: Thresholds) -> int:
    return 2 * th.chance_steps + 2


def _held(at: np.ndarray, off: np.ndarray, steps: int) -> np.ndarray:
    """Rows that are `at`, with no `off` row among the `steps` - 1 before (rows neither,
    a step without a loss, do not break the stretch)."""
    counts = np.concatenate([[0], np.cumsum(off.astype(np.int64))])
    rows = np.arange(len(at))
    start = rows - steps + 1
    return at & (start >= 0) & (counts[rows + 1] - counts[np.maximum(start, 0)] == 0)


def _trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of the finite values among each row and the `window` - 1 before it: a
    batch's labels move a loss at chance by a few hundredths either way."""
    finite = np.isfinite(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    rows = np.arange(len(values)) + 1
    start = np.maximum(rows - window, 0)
    n = counts[rows] - counts[start]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (sums[rows] - sums[start]) / n, np.nan)


def _carried(values: np.ndarray) -> np.ndarray:
    """The last value read (not NaN), carried over the steps between sampled ones."""
    last = np.maximum.accumulate(np.where(~np.isnan(values), np.arange(len(values)), -1))
    return np.where(last >= 0, values[np.maximum(last, 0)], np.nan)


def _chance_words(level: float) -> str:
    """The chance level said: ln(C) where the classes are balanced (the level is the log
    of a whole number: `record.loss_form.chance_level`), else what it is."""
    classes = round(math.exp(level))
    if classes >= 2 and math.isclose(math.exp(level), classes, rel_tol=1e-6):
        return f"ln(C) = {fmt(math.log(classes))} for C = {classes} classes"
    return (f"chance is {fmt(level)} here, the loss of predicting each class by its "
            f"frequency: the classes are not balanced")


def chance_findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    """A mean cross-entropy over C classes (`loss_chance`, read on sampled steps: the
    loss of predicting each class by its frequency among the labels seen, ln C for
    balanced classes) whose mean over the last `window` steps stays at it or a little
    above
    (`CHANCE_MARGIN`, `CHANCE_ABOVE`) for
    `chance_steps` steps in a row: a warning; for twice
    as many, an error. A model that learns nothing from its inputs predicts the classes'
    frequencies, and its loss stays where a uniform guess starts. The sentence says
    where the gradients were clipped to the same total norm at every step (the usual
    `clip_grad_norm_` typo), or where the learning rate is 0."""
    loss = trace.scalar("loss", lo, stop)
    chance = trace.scalar("loss_chance", lo, stop)
    level = _carried(chance)
    # a loss given squashed outputs (`findings`) stays near chance for that reason, which
    # its own error says
    squashed = _carried(trace.scalar("loss_squashed", lo, stop))
    smooth = _trailing_mean(loss, th.window)
    with np.errstate(invalid="ignore"):
        judged = np.isfinite(loss) & np.isfinite(level) & ~(squashed > 0)
        at = judged & (smooth >= (1 - CHANCE_MARGIN) * level) & (smooth <= CHANCE_ABOVE * level)
    off = judged & ~at
    k = th.chance_steps
    codes = grade(judged[:, None], (_held(at, off, k)[:, None], WARNING),
                  (_held(at, off, 2 * k)[:, None], ERROR))
    grads = trace.col("grad_norm", lo, stop).astype(np.float64)
    with np.errstate(invalid="ignore"):
        total = np.sqrt(np.nansum(grads ** 2, axis=1))
    total[~np.isfinite(grads).any(axis=1)] = np.nan
    lr = trace.scalar("lr", lo, stop)

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        row = s - lo
        held = 2 * k if sev == "error" else k
        first = max(row - held + 1, 0)
        text = (f"the loss has stayed at chance for {held} steps, by step {s} ({fmt(v)}; "
                f"{_chance_words(p)}): the model learns nothing from its inputs. ")
        span = total[first:row + 1]
        span = span[np.isfinite(span)]
        rates = lr[first:row + 1]
        if len(span) >= 2 and span.min() > 0 and span.max() <= span.min() * (1 + 1e-3):
            return text + (f"The gradients' total norm is {fmt(float(np.median(span)))} at "
                           f"every step: clipped to it (clip_grad_norm_'s max_norm), so "
                           f"every update is that small. Raise max_norm (1.0 is usual)")
        if len(rates) and np.all(rates == 0):
            return text + "The learning rate is 0"
        return text + ("Check that each label belongs to its input (inputs and labels "
                       "shuffled apart, a wrong label column), that batches are shuffled "
                       "(data sorted by class, with shuffle=False), and that the learning "
                       "rate is not far too small")

    return [Finding("loss_at_chance", "chance", codes, loss[:, None], previous=level[:, None],
                    per_layer=False, message=message,
                    recovery=lambda n, s, v, p, sev: f"the loss fell below chance at step {s} "
                                                     f"({fmt(v)})")]
