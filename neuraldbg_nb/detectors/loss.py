"""The loss: not finite, jumping above its recent level, or climbing over a longer trend
(a slow divergence, e.g. gradients accumulating without `zero_grad`, never jumps)."""

from __future__ import annotations

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._baseline import lagged, log_level, shift_beyond
from ._scan import ERROR, HOLD, OK, Finding, fmt


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    loss = trace.scalar("loss", lo, stop)[:, None]
    nonfinite = np.where(np.isnan(loss), HOLD, np.where(np.isfinite(loss), OK, ERROR))
    logs = log_level(loss)
    shift, base = shift_beyond(logs, th.window, th.warmup, th.noise)
    level = 10.0 ** base
    rising = ~np.isnan(shift)
    up = (logs > base) & (shift >= np.log10(th.loss_rise))
    diverge = np.where(rising, np.where(up, ERROR, OK), HOLD)
    then = lagged(base, th.trend)
    climb = base - then
    trend = np.where(np.isnan(climb), HOLD,
                     np.where(climb >= np.log10(th.loss_rise), ERROR, OK)).astype(np.int8)
    return [
        Finding("loss_divergence", "loss_trend", trend, 10.0 ** base, previous=10.0 ** then,
                per_layer=False, patience=th.patience,
                message=lambda n, s, v, p, sev: f"loss climbed {v / p:.0f}x over {th.trend} "
                                                f"steps by step {s} (recent level {fmt(p)} -> "
                                                f"{fmt(v)})",
                recovery=lambda n, s, v, p, sev: f"loss back down ({fmt(v)}) at step {s}"),
        Finding("loss_nonfinite", "loss", nonfinite.astype(np.int8), loss, per_layer=False,
                sticky=True, message=lambda n, s, v, p, sev: f"loss became non-finite at step "
                                                             f"{s} (was {fmt(p)})"),
        Finding("loss_divergence", "loss", diverge.astype(np.int8), loss, previous=level,
                per_layer=False, patience=2,
                message=lambda n, s, v, p, sev: f"loss diverged at step {s}: {fmt(v)}, "
                                                f"{v / p:.0f}x its recent level {fmt(p)}",
                recovery=lambda n, s, v, p, sev: f"loss back to its recent level ({fmt(v)}) "
                                                 f"at step {s}"),
    ]
