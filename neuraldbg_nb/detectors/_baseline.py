"""Each layer's own recent level, in log space: what a regime shift is measured against."""

from __future__ import annotations

import numpy as np


def log_level(values: np.ndarray) -> np.ndarray:
    """log10 of positive finite values; NaN elsewhere (zero, negative, non-finite, missing)."""
    out = np.full(values.shape, np.nan)
    ok = np.isfinite(values) & (values > 0)
    out[ok] = np.log10(values[ok])
    return out


SCALE = 2.0 ** 20
"""Fixed-point scale of log10 values in the window sums (a millionth of a decade)."""


def trailing_stats(logs: np.ndarray, window: int, warmup: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of the finite entries in the `window` rows before each
    row (NaN where fewer than `warmup` are there). Causal: row t never sees row t or later,
    so a step's baseline is the same whether the trace ends there or goes on.

    The window sums are differences of running sums in fixed-point integers: exact (the
    int64 wrap-around cancels in the difference), so a step's baseline is bit-identical
    whichever block of rows it was computed in, live step by step or all at once."""
    ok = ~np.isnan(logs)
    q = np.rint(np.where(ok, logs, 0.0) * SCALE).astype(np.int64)
    n = logs.shape[0]
    sums = np.zeros((n + 1,) + logs.shape[1:], np.int64)
    squares = np.zeros_like(sums)
    counts = np.zeros(sums.shape, np.int32)
    with np.errstate(over="ignore"):
        np.cumsum(q, axis=0, out=sums[1:])
        np.cumsum(q * q, axis=0, out=squares[1:])
    np.cumsum(ok, axis=0, out=counts[1:])
    # window [t - window, t) for row t: running sums at t minus those at max(t - window, 0)
    lo = np.maximum(np.arange(n) - window, 0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        c = (counts[:n] - counts[lo]).astype(np.float64)
        mean = (sums[:n] - sums[lo]) / np.maximum(c, 1) / SCALE
        var = (squares[:n] - squares[lo]) / np.maximum(c, 1) / SCALE ** 2 - mean ** 2
    enough = c >= warmup
    return (np.where(enough, mean, np.nan),
            np.where(enough, np.sqrt(np.maximum(var, 0.0)), np.nan))


def shift_beyond(logs: np.ndarray, window: int, warmup: int, noise: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(|shift| against the recent mean, the recent mean) with the shift measured in
    decades beyond what the series' own noise explains: a jump must exceed `noise`
    standard deviations of the recent history to count at all. NaN where not judged."""
    mean, std = trailing_stats(logs, window, warmup)
    shift = np.abs(logs - mean)
    return np.where(shift >= noise * std, shift, 0.0 * shift), mean
