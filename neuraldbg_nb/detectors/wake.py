"""When a live run should scan now rather than later.

Scanning every step would cost milliseconds of host time per step; the live run scans in
batches instead (the result is the same: the scan is chunk-invariant). This test of the
newest step against the one before decides when to scan at once, so that a sudden
failure is found, captured and stopped at the step it happens: something turned
non-finite, a gradient crossed the vanish or explode line, a dead or saturated fraction
crossed its line, the input turned non-finite or all zero, or a number moved by
`sqrt(jump)` or more. It only decides *when* detection runs, never *what* it finds; a
slow drift is found at the next batch.
"""

from __future__ import annotations

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace

_MOVERS = ("act_absmax", "grad_norm", "param_norm")


def wake(trace: Trace, th: Thresholds) -> bool:
    """True if the newest step may start an event."""
    t = trace.n_steps - 1
    if t < 1:
        return False
    rows = [trace.col(c, t - 1, t + 1) for c in _MOVERS]
    rows.append(np.stack([trace.scalar(c, t - 1, t + 1) for c in ("loss", "in_absmax")], 1))
    before, now = np.concatenate(rows, 1).astype(np.float64)
    grad_b, grad = trace.col("grad_norm", t - 1, t + 1)
    dead_b, dead = trace.col("dead_frac", t - 1, t + 1)
    sat_b, sat = trace.col("sat_frac", t - 1, t + 1)
    inf_b, inf = trace.scalar("in_nonfinite", t - 1, t + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.abs(np.log10(now / before))
        factor = 0.5 * np.log10(th.jump)
        flags = np.concatenate([
            np.isinf(now) & ~np.isinf(before),
            ratio >= factor,
            (grad < th.vanish) & ~(grad_b < th.vanish),
            (grad > th.explode) & ~(grad_b > th.explode),
            (dead >= th.dead) & ~(dead_b >= th.dead),
            (sat >= th.saturated) & ~(sat_b >= th.saturated),
            [inf > 0 and not inf_b > 0, now[-1] == 0 and before[-1] != 0],
        ])
    return bool(flags.any())
