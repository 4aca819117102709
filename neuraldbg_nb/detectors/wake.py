"""When a live run should scan now rather than later.

Scanning every step would cost milliseconds of host time per step; the live run scans in
batches instead (the result is the same: the scan is chunk-invariant). This test of the
newest step against the one before decides when to scan at once, so that a sudden
failure is found, captured and stopped at the step it happens: something turned
non-finite, a gradient crossed the vanish or explode line, a dead or saturated fraction
crossed its line (against the last sampled step), the input turned non-finite or all
zero, or a number moved by `sqrt(jump)` or more (gradients: `sqrt(jump_error)`). It only
decides *when* detection runs, never *what* it finds; a slow drift is found at the next
batch.
"""

from __future__ import annotations

import functools

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace

_MOVERS = ("act_absmax", "param_norm", "grad_norm")
"""Per-layer columns compared with the step before; gradients last (see `wake`)."""


def wake(trace: Trace, th: Thresholds) -> bool:
    """True if the newest step may start an event (judged on the columns measured every
    step; sampled ones are compared by `SampledWake`). It runs after every step of a live
    run, so it is a handful of whole-row numpy ops: a row's move of `f` decades or more,
    |log10(now / before)| >= f, is read as now / before outside (10**-f, 10**f)."""
    t = trace.n_steps - 1
    if t < 1:
        return False
    cols = [trace.col(c, t - 1, t + 1) for c in _MOVERS]
    both = np.concatenate(cols + [trace.scalar(c, t - 1, t + 1)[:, None] for c in _SCALARS],
                          1).astype(np.float64)
    before, now = both[:, :-1]
    hi, lo = _bands(trace.n_layers, th)
    grad_b, grad = cols[-1]  # as recorded (float32), as the gradient detector compares them
    with np.errstate(invalid="ignore", divide="ignore"):
        q = now / before
        moved = (q >= hi) | ((q <= lo) & (q >= 0)) | (np.isinf(now) & ~np.isinf(before))
        crossed = ((grad < th.vanish) & ~(grad_b < th.vanish)) \
            | ((grad > th.explode) & ~(grad_b > th.explode))
    inf_b, inf = both[:, -1]
    return bool(moved.any() or crossed.any() or (inf > 0 and not inf_b > 0)
                or (now[-1] == 0 and before[-1] != 0))


_SCALARS = ("loss", "in_absmax", "in_nonfinite")
"""Per-step columns read by `wake`: the first two are compared like the movers."""


@functools.lru_cache(maxsize=8)
def _bands(n_layers: int, th: Thresholds) -> tuple[np.ndarray, np.ndarray]:
    """(10**f, 10**-f) for each value `wake` compares: half the jump in decades; gradients
    swing by a decade on ordinary batches and only warn from `jump_error`, so they wake
    from half of that."""
    f = np.full(3 * n_layers + 2, np.log10(th.wake_jump))
    f[2 * n_layers: 3 * n_layers] = 0.5 * np.log10(max(th.jump, th.jump_error))
    return 10.0 ** f, 10.0 ** -f


class SampledWake:
    """The same test for the sampled columns (dead units, saturation), against the last
    sampled step rather than the step before, which was not measured."""

    def __init__(self) -> None:
        self._last: np.ndarray | None = None

    def __call__(self, trace: Trace, th: Thresholds) -> bool:
        t = trace.n_steps - 1
        if t < 0 or not trace.scalar("sampled", t, t + 1)[0] > 0:
            return False
        with np.errstate(invalid="ignore"):
            now = np.concatenate([trace.col("dead_frac", t, t + 1)[0] >= th.dead,
                                  trace.col("sat_frac", t, t + 1)[0] >= th.saturated])
        last, self._last = self._last, now
        if last is None or len(last) != len(now):
            return bool(now.any())
        return bool((now & ~last).any())
