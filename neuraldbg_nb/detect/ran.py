"""Which layers ran in each step's forward, as far as the trace tells.

A layer ran at a step whose layer hooks were on (the `hooked` scalar; older files have none
and were hooked throughout) where its output was measured (`act_absmax` not NaN). Between
such steps, where the hooks are off, each layer is taken to run as it did at the last
hooked step before: a training's forward calls the same layers step after step, and the
rules that ask whether a layer ran (a frozen layer, one cut off from the loss) judge
every step that way instead of one in a few.
"""

from __future__ import annotations

import numpy as np

from ..trace.columns import Trace

LOOKBACK = 64
"""Steps before a scanned range read to find its last hooked step (hooked steps are a few
apart: `trace.HOOK_GAP` at most)."""


def hooked(trace: Trace, lo: int, stop: int) -> np.ndarray:
    """Per step: were its layers' outputs measured (hooked, or replayed)?"""
    return ~(trace.scalar("hooked", lo, stop) == 0)  # NaN: a file from before the column


def ran(trace: Trace, lo: int, stop: int) -> np.ndarray:
    """(steps, layers): did the layer run in the step's forward (measured at a hooked
    step, carried from the last hooked one over the steps between; False before any)?"""
    start = min(lo, max(trace.full_from, lo - LOOKBACK))  # exact steps only
    seen = ~np.isnan(trace.col("act_absmax", start, stop))
    on = hooked(trace, start, stop)
    last = np.where(on, np.arange(len(on)), -1)
    np.maximum.accumulate(last, out=last)
    out = seen[np.maximum(last, 0)] & (last >= 0)[:, None]
    return out[lo - start:]
