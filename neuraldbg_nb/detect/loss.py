"""The loss: not finite, jumping above its recent level, or climbing over a longer trend
(a slow divergence, e.g. gradients accumulating without `zero_grad`, never jumps)."""

from __future__ import annotations

import numpy as np

from ..trace.columns import Trace
from .baseline import lagged, log_level, shift_beyond, within
from .scan import ERROR, HOLD, OK, WARNING, Finding, fmt
from .thresholds import Thresholds

FAR_BELOW = 0.1
"""A loss that jumps or climbs but stays under this share of the run's first loss is a
warning, not an error: the run has not lost what it learned. A curriculum that makes its
inputs 5x noisier moves a classifier's loss 0.0009 -> 0.04 (its first loss: 1.7), and
as an error, `stop_on="error"` would stop a training that is fine."""


def _grave(values: np.ndarray, first: float) -> np.ndarray:
    """ERROR where a risen loss is a failure, WARNING where it is still far below where
    the run started (`FAR_BELOW`); a loss that can be negative or zero is not judged so."""
    if not first > 0:
        return np.full(values.shape, ERROR, np.int8)
    with np.errstate(invalid="ignore"):
        return np.where((values > 0) & (values < FAR_BELOW * first), WARNING, ERROR)


def _still_below(v: float, first: float, sev: str) -> str:
    return (f"; still {first / v:.0f}x below its first value {fmt(first)}"
            if sev == "warning" else "")


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    loss = trace.scalar("loss", lo, stop)[:, None]
    first = trace.first_loss
    nonfinite = np.where(np.isnan(loss), HOLD, np.where(np.isfinite(loss), OK, ERROR))
    logs = log_level(loss)
    shift, base = shift_beyond(logs, th.window, th.warmup, th.noise)
    level = 10.0 ** base
    rising = ~np.isnan(shift)
    up = (logs > base) & (shift >= np.log10(th.loss_rise))
    diverge = np.where(rising, np.where(up, _grave(loss, first), OK), HOLD)
    then = lagged(base, th.trend)
    climb = base - then
    rise = np.log10(th.loss_rise)
    # a level that jumped within the trend (or the window its level `then` was read over)
    # climbed by that jump, which the jump's event reports: a curriculum's harder inputs
    # (0.0009 -> 0.04 at step 150, hovering after) would read as a second failure too,
    # "climbed 11x over 200 steps by step 293"
    jumped = within(up & rising, th.trend + th.window)
    trend = np.where(np.isnan(climb), HOLD,
                     np.where((climb >= rise) & ~jumped,
                              _grave(10.0 ** base, first), OK)).astype(np.int8)
    return [
        Finding("loss_divergence", "loss_trend", trend, 10.0 ** base, previous=10.0 ** then,
                per_layer=False, patience=th.patience,
                message=lambda n, s, v, p, sev: f"loss climbed {v / p:.0f}x over {th.trend} "
                                                f"steps by step {s} (recent level {fmt(p)} -> "
                                                f"{fmt(v)})" + _still_below(v, first, sev),
                recovery=lambda n, s, v, p, sev: f"loss back down ({fmt(v)}) at step {s}"),
        Finding("loss_nonfinite", "loss", nonfinite.astype(np.int8), loss, per_layer=False,
                sticky=True, message=lambda n, s, v, p, sev: f"loss became non-finite at step "
                                                             f"{s} (was {fmt(p)})"),
        Finding("loss_divergence", "loss", diverge.astype(np.int8), loss, previous=level,
                per_layer=False, patience=2,
                message=lambda n, s, v, p, sev: f"loss {'diverged' if sev == 'error' else 'jumped'}"
                                                f" at step {s}: {fmt(v)}, {v / p:.0f}x its "
                                                f"recent level {fmt(p)}"
                                                + _still_below(v, first, sev),
                recovery=lambda n, s, v, p, sev: f"loss back to its recent level ({fmt(v)}) "
                                                 f"at step {s}"),
        _above_first(loss, first, rising, th),
    ]


def _above_first(loss: np.ndarray, first: float, rising: np.ndarray, th: Thresholds
                 ) -> Finding:
    """A loss `loss_rise` or more above the run's first loss, held for `patience` steps:
    a divergence within the first steps, before the loss has a recent level to jump from
    (`warmup`, and `patience` steps more to hold it): a learning rate far too high takes
    a classifier's loss from 2.3 to 40-180 by its second step, where it then swings, and
    the recent level the jump check reads from there is the diverged one. A later rise is
    the jump's and the trend's checks' (one event per divergence). Between sqrt(`loss_rise`) and `loss_rise` times the first loss a
    reported divergence holds, so a swing down is no recovery. A loss that can be zero
    or negative is not judged so; a non-finite one is `loss_nonfinite`'s."""
    if not (first > 0 and np.isfinite(first)):
        codes = np.full(loss.shape, OK, np.int8)
    else:
        with np.errstate(invalid="ignore"):
            above = np.isfinite(loss) & (loss >= th.loss_rise * first)
            band = np.isfinite(loss) & (loss >= np.sqrt(th.loss_rise) * first)
            judged = within(~rising, th.patience)
            codes = np.where(np.isnan(loss) | band & ~(above & judged), HOLD,
                             np.where(above, ERROR, OK)).astype(np.int8)
    return Finding("loss_divergence", "loss_start", codes, loss,
                   previous=np.full(loss.shape, first), per_layer=False, patience=th.patience,
                   hold_counts=False,
                   message=lambda n, s, v, p, sev: f"loss diverged at step {s}: {fmt(v)}, "
                                                   f"{v / p:.0f}x its first value {fmt(p)}, "
                                                   f"and stayed {th.loss_rise:g}x or more above "
                                                   f"it for {th.patience} steps")
