"""When a live run should scan now rather than later.

Scanning every step would cost milliseconds of host time per step; the live run scans in
batches instead (the result is the same: the scan is chunk-invariant). This test of the
newest step against the one before decides when to scan at once, so that a sudden
failure is found, captured and stopped at the step it happens: something turned
non-finite, a gradient crossed the vanish or explode line, a dead or saturated fraction
crossed its line (against the last two sampled steps), the input turned non-finite or
all zero, the gradients were carried over (no zero_grad) or missing at the optimizer's
step a second step in a row, or a number moved by `sqrt(jump)` or more (gradients:
`sqrt(jump_error)`; the loss: a rise of `sqrt(loss_rise)`). It only decides *when*
detection runs, never *what* it finds; a slow drift is found at the next batch.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from .gradients import SLOW_MARGIN, explode_line


def wake(trace: Trace, th: Thresholds) -> str:
    """Whether the newest step may start an event (judged on the columns measured every
    step; sampled ones are compared by `SampledWake`): "" if not, "sudden" where an event
    would be reported at this step, "slow" where it is reported only after holding for a
    while (a gradient crossing the vanish line, a rising loss), so that a second scan is
    worth making then. A value's move of `f` decades or more, |log10(now / before)| >= f,
    is read as now / before outside (10**-f, 10**f) (`_bands`). The loss is only judged
    upward (only a rise is a failure), from `sqrt(loss_rise)`: a noisy loss near its
    minimum falls and rises by several times from batch to batch.

    It runs after every step of a live run, right after the training step has emptied the
    CPU's caches, so it reads the two rows as Python floats and compares them in plain
    loops: as whole-row numpy ops (until session 20) it took 0.17 ms a step on the
    benchmark MLP, each numpy call paying its cold start; this takes 0.07."""
    t = trace.n_steps - 1
    if t < 1:
        return ""
    act_b, act = trace.col("act_absmax", t - 1, t + 1).tolist()
    grad_b, grad = trace.col("grad_norm", t - 1, t + 1).tolist()
    # the weight norm after an update reaches the trace with the next step: one step back
    w_b, w = trace.col("param_norm", t - 2, t).tolist() if t >= 2 else ([], [])
    (loss_b, loss), (in_b, in_now), (inf_b, inf) = (trace.scalar(c, t - 1, t + 1).tolist()
                                                     for c in _SCALARS)
    jump, grad_jump, rise = _bands(th.wake_jump, th.jump, th.jump_error, th.loss_rise)
    line = explode_line(trace, th)[0]
    loss_moved = _moved(loss_b, loss, rise, -1.0)  # a fall never wakes (-1: q <= -1 < 0)
    rose = loss_moved and math.isfinite(loss)  # a divergence must hold a while
    if (any(_moved(b, x, *jump) for b, x in zip(act_b + w_b, act + w))
            or any(_moved(b, x, *grad_jump) for b, x in zip(grad_b, grad))
            or (loss_moved and not rose) or _moved(in_b, in_now, *jump)
            or any(x > y and not b > y for b, x in zip(grad_b, grad)  # (`gradients._exploding`)
                   for y in (line, line * SLOW_MARGIN))
            or (inf > 0 and not inf_b > 0) or (in_now == 0 and in_b != 0)
            or _anew(trace, "grad_carried", t) or _anew(trace, "grads_missing", t)):
        return "sudden"
    vanished = any(x < th.vanish and not b < th.vanish for b, x in zip(grad_b, grad))
    return "slow" if rose or vanished else ""


def _moved(before: float, now: float, hi: float, lo: float) -> bool:
    """Did a value move out of (lo, hi) times what it was, or turn infinite? As numpy
    divides: x / 0 is inf with x's sign (NaN for 0 / 0), and NaN moves nothing."""
    if math.isinf(now) and not math.isinf(before):
        return True
    try:
        q = now / before
    except ZeroDivisionError:
        if now == 0 or math.isnan(now):
            return False
        q = math.copysign(math.inf, now) * math.copysign(1.0, before)
    return q >= hi or 0 <= q <= lo


def _anew(trace: Trace, column: str, t: int) -> bool:
    """A mistake of the loop (gradients carried over, or missing at the step) at steps
    t-1 and t, and not at t-2: the two steps that make it an error (see `loop`), just
    completed."""
    c = trace.scalar(column, max(t - 2, 0), t + 1).tolist()
    return len(c) == 3 and c[1] > 0 and c[2] > 0 and not c[0] > 0


_SCALARS = ("loss", "in_absmax", "in_nonfinite")
"""Per-step columns read by `wake`: the first two are compared like the layers' values."""


@functools.lru_cache(maxsize=8)
def _bands(wake_jump: float, jump: float, jump_error: float,
           loss_rise: float) -> tuple[tuple[float, float], tuple[float, float], float]:
    """(10**f, 10**-f) for the activations, weights and input, then for the gradients,
    then 10**f for the loss (`wake`): half the jump in decades for the gradients, which
    swing by a decade on ordinary batches and only warn from `jump_error`; half
    `loss_rise` in decades for the loss, which wakes on a rise only. Keyed by the four
    floats: hashing the whole `Thresholds` took 15 us a step (under a line profiler)."""
    f = math.log10(wake_jump)
    g = 0.5 * math.log10(max(jump, jump_error))
    return (10.0 ** f, 10.0 ** -f), (10.0 ** g, 10.0 ** -g), 10.0 ** (0.5 * math.log10(loss_rise))


class SampledWake:
    """The same test for the sampled columns (dead units, saturation), against the last
    two sampled steps rather than the step before, which was not measured: a layer wakes
    the scan when its fraction crosses the line after two samples below it. A layer that
    hovers at the line (a deep ReLU stack's half-dead layers) flips from sample to sample;
    waking on each flip scanned twice every sampled step. Its event, a slow condition, is
    still found by the next batch scan."""

    def __init__(self) -> None:
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # the two last samples

    def __call__(self, trace: Trace, th: Thresholds) -> bool:
        t = trace.n_steps - 1
        if t < 0 or not trace.scalar("sampled", t, t + 1)[0] > 0:
            return False
        with np.errstate(invalid="ignore"):
            now = np.concatenate([trace.col("dead_frac", t, t + 1)[0] >= th.dead,
                                  trace.col("sat_frac", t, t + 1)[0] >= th.saturated])
        last = self._last
        if last is None or len(last[1]) != len(now):
            self._last = (np.zeros_like(now), now)
            return bool(now.any())
        self._last = (last[1], now)
        return bool((now & ~(last[0] | last[1])).any())
