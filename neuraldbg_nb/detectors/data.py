"""The input batch of the watched model: non-finite, all zero, constant, repeated, shifted.

The data is blamed first: a broken batch makes every layer look broken.
"""

from __future__ import annotations

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._scan import ERROR, HOLD, INFO, OK, WARNING, Finding, fmt
from .regime import describe, shift_codes


def _flag(values: np.ndarray, bad: np.ndarray, code: int) -> np.ndarray:
    return np.where(np.isnan(values), HOLD, np.where(bad, code, OK)).astype(np.int8)[:, None]


def _repeat_codes(repeat: np.ndarray, lo: int, window: int) -> np.ndarray:
    """A batch that repeats the one before: a warning where the loop fed other batches
    before (a loader stuck in mid-run, a sampler bug); info where every batch has been the
    same from the first (full-batch training, fitting one batch on purpose, or a loader
    never advanced, `next(iter(loader))` outside the loop: the sentence names them). Also
    info once the last `window` batches all repeated, so that a live scan, which reads
    `window` + 2 rows before its chunk and cannot see the first step after that, codes
    every row as a scan in one go does (a stuck loader's warning stays open)."""
    rep = repeat > 0
    codes = _flag(repeat, rep, WARNING)
    rows = np.arange(len(rep))
    run = rows - np.maximum.accumulate(np.where(rep, -1, rows))  # repeats ending here
    from_start = (lo == 0) & (run >= rows)  # steps 1..t all repeated (step 0 cannot)
    codes[rep & (from_start | (run > window)), 0] = INFO
    return codes


def _repeat_message(n: str, s: int, v: float, p: float, sev: str) -> str:
    if sev == "info":
        return (f"input batch at step {s} repeats the previous batch exactly, as every batch "
                f"has so far: full-batch training, or one batch fitted on purpose (a data "
                f"loader never advanced, next(iter(loader)) outside the loop, looks the same)")
    return f"input batch at step {s} repeats the previous batch exactly"


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
        Finding("data_anomaly", "input_repeat", _repeat_codes(repeat, lo, th.window),
                col(repeat), per_layer=False, message=_repeat_message),
        Finding("data_anomaly", "input_scale", shift, col(absmax), previous=base,
                per_layer=False, message=describe("input batch scale (abs-max)")),
    ]
