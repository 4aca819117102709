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


def _rows(trace: Trace, name: str, t: int) -> tuple[np.ndarray, np.ndarray]:
    if name in ("loss", "in_absmax", "in_nonfinite"):
        return trace.scalar(name, t, t + 1), trace.scalar(name, t - 1, t)
    return trace.col(name, t, t + 1)[0], trace.col(name, t - 1, t)[0]


def _crossed(now: np.ndarray, before: np.ndarray) -> bool:
    return bool((now & ~before).any())


def _moved(now: np.ndarray, before: np.ndarray, factor: float) -> bool:
    both = (now > 0) & (before > 0) & np.isfinite(now) & np.isfinite(before)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(both, now / before, 1.0)
    return bool(((ratio >= factor) | (ratio <= 1 / factor)).any())


def wake(trace: Trace, th: Thresholds) -> bool:
    """True if the newest step may start an event."""
    t = trace.n_steps - 1
    if t < 1:
        return False
    factor = float(np.sqrt(th.jump))
    for name in ("act_absmax", "grad_norm", "param_norm", "loss", "in_absmax"):
        now, before = _rows(trace, name, t)
        if _crossed(np.isinf(now), np.isinf(before)) or _moved(now, before, factor):
            return True
    grad, grad_before = _rows(trace, "grad_norm", t)
    with np.errstate(invalid="ignore"):
        lines = [
            (grad < th.vanish, grad_before < th.vanish),
            (grad > th.explode, grad_before > th.explode),
            (*(r >= th.dead for r in _rows(trace, "dead_frac", t)),),
            (*(r >= th.saturated for r in _rows(trace, "sat_frac", t)),),
            (*(r > 0 for r in _rows(trace, "in_nonfinite", t)),),
            (*(r == 0 for r in _rows(trace, "in_absmax", t)),),
        ]
    return any(_crossed(now, before) for now, before in lines)
