"""The loss: not finite, or diverging from its own recent level."""

from __future__ import annotations

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._baseline import log_level, shift_beyond
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
    return [
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
