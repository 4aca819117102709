"""Regime shifts: a layer's activations or gradients jump against their own recent history.

Measured in log space against the trailing mean of the last `window` steps, so a layer is
judged by its own scale: a 240x jump of a layer that always sat at 1e-3 is found as
surely as one of a layer at 10. A jump must also stand out of the layer's own recent
noise (`noise` standard deviations), so a layer whose per-batch gradient always swings
by a decade is not flagged for doing so. See `shift_codes` for the severities.
"""

from __future__ import annotations

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._baseline import log_level, shift_beyond
from ._scan import ERROR, HOLD, INFO, OK, WARNING, Finding, Message, fmt


def shift_codes(values: np.ndarray, th: Thresholds, loud: bool
                ) -> tuple[np.ndarray, np.ndarray]:
    """(codes, baseline level) of a jump against each column's own recent history.

    Loud signals (activations, the input) warn from `jump` and are errors from
    `jump_error`; quiet ones (gradients, which jump as a symptom of almost anything and
    swing by decades on healthy batches near a perfect fit) are info from `jump` and
    warnings from `jump_error`."""
    shift, base = shift_beyond(log_level(values), th.window, th.warmup, th.noise)
    known = ~np.isnan(shift)
    codes = np.full(values.shape, HOLD, np.int8)
    codes[known] = OK
    codes[known & (shift >= np.log10(th.jump))] = WARNING if loud else INFO
    codes[known & (shift >= np.log10(max(th.jump, th.jump_error)))] = ERROR if loud else WARNING
    return codes, 10.0 ** base


def describe(what: str) -> Message:
    """The sentence of a jump or a collapse of `what`."""
    def message(n: str, s: int, v: float, p: float, sev: str) -> str:
        factor = v / p if p > 0 else float("inf")
        who = f"{n}: {what}" if n else what
        if factor >= 1:
            return f"{who} jumped {factor:.0f}x at step {s} ({fmt(p)} -> {fmt(v)})"
        return f"{who} collapsed {1 / factor:.0f}x at step {s} ({fmt(p)} -> {fmt(v)})"
    return message


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    act = trace.col("act_absmax", lo, stop).astype(np.float64)
    grad = trace.col("grad_norm", lo, stop).astype(np.float64)
    act_codes, act_base = shift_codes(act, th, loud=True)
    grad_codes, grad_base = shift_codes(grad, th, loud=False)
    return [
        Finding("regime_shift", "activation", act_codes, act, previous=act_base,
                message=describe("activations (abs-max)")),
        Finding("regime_shift", "gradient", grad_codes, grad, previous=grad_base,
                message=describe("gradient norm")),
    ]
