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

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from .gradients import SLOW_MARGIN, explode_line

_MOVERS = ("act_absmax", "grad_norm")
"""Per-layer columns of the newest step compared with the step before. The weight norm
after an update reaches the trace with the next step, so it is compared one step back."""


def wake(trace: Trace, th: Thresholds) -> str:
    """Whether the newest step may start an event (judged on the columns measured every
    step; sampled ones are compared by `SampledWake`): "" if not, "sudden" where an event
    would be reported at this step, "slow" where it is reported only after holding for a
    while (a gradient crossing the vanish line, a rising loss), so that a second scan is
    worth making then. It runs after every step of a live run, so it is a handful of
    whole-row numpy ops: a row's move of `f` decades or more, |log10(now / before)| >= f,
    is read as now / before outside (10**-f, 10**f). The loss is only judged upward (only
    a rise is a failure), from `sqrt(loss_rise)`: a noisy loss near its minimum falls and
    rises by several times from batch to batch."""
    t = trace.n_steps - 1
    if t < 1:
        return ""
    n = trace.n_layers
    act, grad = (trace.col(c, t - 1, t + 1) for c in _MOVERS)
    weights = trace.col("param_norm", t - 2, t) if t >= 2 else np.full((2, n), np.nan)
    scalars = [trace.scalar(c, t - 1, t + 1)[:, None] for c in _SCALARS]
    both = np.concatenate([act, weights, grad, *scalars], 1).astype(np.float64, copy=False)
    before, now = both[:, :-1]
    hi, lo = _bands(n, th)
    grad_b, grad_now = grad
    with np.errstate(invalid="ignore", divide="ignore"):
        q = now / before
        moved = (q >= hi) | ((q <= lo) & (q >= 0)) | (np.isinf(now) & ~np.isinf(before))
        vanished = ((grad_now < th.vanish) & ~(grad_b < th.vanish)).any()
        line = explode_line(trace, th)[0]
        exploded = any(((grad_now > x) & ~(grad_b > x)).any()  # (`gradients._exploding`)
                       for x in (line, line * SLOW_MARGIN))
    inf_b, inf = both[:, -1]
    loss = 3 * n
    rose = moved[loss] and np.isfinite(now[loss])  # a divergence must hold a while
    if moved[:loss].any() or (moved[loss] and not rose) or moved[loss + 1] or exploded \
            or (inf > 0 and not inf_b > 0) or (now[-1] == 0 and before[-1] != 0) \
            or _anew(trace, "grad_carried", t) or _anew(trace, "grads_missing", t):
        return "sudden"
    return "slow" if rose or vanished else ""


def _anew(trace: Trace, column: str, t: int) -> bool:
    """A mistake of the loop (gradients carried over, or missing at the step) at steps
    t-1 and t, and not at t-2: the two steps that make it an error (see `loop`), just
    completed."""
    c = trace.scalar(column, max(t - 2, 0), t + 1)
    return len(c) == 3 and c[1] > 0 and c[2] > 0 and not c[0] > 0


_SCALARS = ("loss", "in_absmax", "in_nonfinite")
"""Per-step columns read by `wake`: the first two are compared like the movers."""


@functools.lru_cache(maxsize=8)
def _bands(n_layers: int, th: Thresholds) -> tuple[np.ndarray, np.ndarray]:
    """(10**f, 10**-f) for each value `wake` compares, in its order (activations,
    weights, gradients, loss, input): half the jump in decades; gradients swing by a
    decade on ordinary batches and only warn from `jump_error`, so they wake from half of
    that; the loss wakes on a rise of half `loss_rise` in decades and never on a fall."""
    f = np.full(3 * n_layers + 2, np.log10(th.wake_jump))
    f[2 * n_layers: 3 * n_layers] = 0.5 * np.log10(max(th.jump, th.jump_error))
    f[3 * n_layers] = 0.5 * np.log10(th.loss_rise)
    lo = 10.0 ** -f
    lo[3 * n_layers] = -1.0  # q <= lo never holds where q >= 0: no fall of the loss wakes
    return 10.0 ** f, lo


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
