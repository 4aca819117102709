"""A GradScaler's loss scale that collapses: every step skipped.

A GradScaler multiplies the loss by its scale before the backward; where the gradients
overflow it skips the optimizer's step and halves the scale. Gradients that overflow at
any scale (a NaN in the loss, a forward that overflows float16) make it halve the scale
at every iteration: 65536 falls below 1 in 17 iterations and to 1e-30 in 116, and no
weight moves. A step's row holds the scale at its first and last scaled backward
(`amp_scale_from`, `amp_scale`): one that fell below 1 within the row, with no optimizer
step between, is the collapse, an error. A scale that halves a few times at the start
(65536 is too high for most models) and settles is the scaler working: it never gets
near 1.
"""

from __future__ import annotations

import math

import numpy as np

from ..trace.columns import Trace
from .scan import ERROR, HOLD, OK, Finding, fmt
from .thresholds import Thresholds

FLOOR = 1.0
"""A loss scale below which no gradient that is finite overflows float16 (65504 at scale
1): a scaler that fell there finds the gradients non-finite at every scale."""


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    last = trace.scalar("amp_scale", lo, stop)
    first = trace.scalar("amp_scale_from", lo, stop)
    with np.errstate(invalid="ignore"):
        fell = (last < FLOOR) & (last < first)
    codes = np.where(np.isnan(last), HOLD, np.where(fell, ERROR, OK)).astype(np.int8)

    def message(n: str, s: int, v: float, p: float, sev: str) -> str:
        over = f" over {round(math.log2(p / v)) + 1} iterations" if v > 0 and p > 0 else ""
        return (f"the loss scale fell from {fmt(p)} to {fmt(v)}{over} by step {s}, with no "
                f"optimizer step between: every step was "
                f"skipped, the gradients overflow even at tiny scales: look for a NaN or "
                f"inf in the loss or the data (a log or a division of 0), or a layer whose "
                f"forward overflows float16 (run it under torch.autocast(..., "
                f"enabled=False), or autocast to bfloat16)")

    return [Finding("nonfinite_gradient", "loss_scale", codes[:, None], last[:, None],
                    previous=first[:, None], per_layer=False, message=message,
                    recovery=lambda n, s, v, p, sev: f"the loss scale holds again "
                                                     f"({fmt(v)}) at step {s}")]
