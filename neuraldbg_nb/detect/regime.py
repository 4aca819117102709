"""Regime shifts: a layer's activations or gradients jump against their own recent history.

Measured in log space against the trailing mean of the last `window` steps, so a layer is
judged by its own scale: a 240x jump of a layer that always sat at 1e-3 is found as
surely as one of a layer at 10. Activation jumps are errors from `jump_error`; gradient
jumps stay warnings (gradients jump as a symptom of almost anything).
"""

from __future__ import annotations

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._baseline import log_level, trailing_mean
from ._scan import ERROR, HOLD, OK, WARNING, Finding, fmt


def shift_codes(values: np.ndarray, th: Thresholds, can_error: bool
                ) -> tuple[np.ndarray, np.ndarray]:
    """(codes, baseline level) of a jump against each column's own recent history."""
    logs = log_level(values)
    base = trailing_mean(logs, th.window, th.warmup)
    shift = np.abs(logs - base)
    known = ~np.isnan(shift)
    codes = np.full(values.shape, HOLD, np.int8)
    codes[known] = OK
    codes[known & (shift >= np.log10(th.jump))] = WARNING
    if can_error:
        codes[known & (shift >= np.log10(max(th.jump, th.jump_error)))] = ERROR
    return codes, 10.0 ** base


def describe(what: str):  # noqa: ANN201 - returns a Message
    def message(n: str, s: int, v: float, p: float, sev: str) -> str:
        factor = v / p if p > 0 else float("inf")
        if factor >= 1:
            return f"{n}: {what} jumped {factor:.0f}x at step {s} ({fmt(p)} -> {fmt(v)})"
        return f"{n}: {what} collapsed {1 / factor:.0f}x at step {s} ({fmt(p)} -> {fmt(v)})"
    return message


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    act = trace.col("act_absmax", lo, stop).astype(np.float64)
    grad = trace.col("grad_norm", lo, stop).astype(np.float64)
    act_codes, act_base = shift_codes(act, th, can_error=True)
    grad_codes, grad_base = shift_codes(grad, th, can_error=False)
    return [
        Finding("regime_shift", "activation", act_codes, act, previous=act_base,
                message=describe("activations (abs-max)")),
        Finding("regime_shift", "gradient", grad_codes, grad, previous=grad_base,
                message=describe("gradient norm")),
    ]
