"""The input batch of the watched model: non-finite, all zero, constant, repeated, shifted.

The data is blamed first: a broken batch makes every layer look broken.
"""

from __future__ import annotations

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._scan import ERROR, HOLD, OK, WARNING, Finding, fmt
from .regime import describe, shift_codes


def _flag(values: np.ndarray, bad: np.ndarray, code: int) -> np.ndarray:
    return np.where(np.isnan(values), HOLD, np.where(bad, code, OK)).astype(np.int8)[:, None]


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    nonfinite = trace.scalar("in_nonfinite", lo, stop)
    absmax = trace.scalar("in_absmax", lo, stop)
    const = trace.scalar("in_const", lo, stop)
    repeat = trace.scalar("in_repeat", lo, stop)
    shift, base = shift_codes(absmax[:, None], th, loud=True)
    col = lambda a: a[:, None]
    return [
        Finding("data_anomaly", "input_nonfinite", _flag(nonfinite, nonfinite > 0, ERROR),
                col(nonfinite), per_layer=False,
                message=lambda n, s, v, p, sev: (f"input batch has {v:.0f} non-finite value{'s' * (v != 1)}"
                                                 if v < float("inf") else
                                                 "input batch has non-finite values")
                + f" at step {s}"),
        Finding("data_anomaly", "input_zero", _flag(absmax, absmax == 0, ERROR), col(absmax),
                per_layer=False,
                message=lambda n, s, v, p, sev: f"input batch is all zeros at step {s}"),
        Finding("data_anomaly", "input_constant",
                _flag(const, (const > 0) & (absmax != 0), WARNING), col(absmax),
                per_layer=False,
                message=lambda n, s, v, p, sev: f"input batch is constant ({fmt(v)} "
                                                f"everywhere) at step {s}"),
        Finding("data_anomaly", "input_repeat", _flag(repeat, repeat > 0, WARNING),
                col(repeat), per_layer=False,
                message=lambda n, s, v, p, sev: f"input batch at step {s} repeats the "
                                                f"previous batch exactly"),
        Finding("data_anomaly", "input_scale", shift, col(absmax), previous=base,
                per_layer=False, message=describe("input batch scale (abs-max)")),
    ]
