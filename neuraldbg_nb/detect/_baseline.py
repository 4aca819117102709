"""Each layer's own recent level, in log space: what a regime shift is measured against."""

from __future__ import annotations

import numpy as np


def log_level(values: np.ndarray) -> np.ndarray:
    """log10 of positive finite values; NaN elsewhere (zero, negative, non-finite, missing)."""
    out = np.full(values.shape, np.nan)
    ok = np.isfinite(values) & (values > 0)
    out[ok] = np.log10(values[ok])
    return out


def trailing_mean(logs: np.ndarray, window: int, warmup: int) -> np.ndarray:
    """Mean of the finite entries in the `window` rows before each row (NaN where fewer
    than `warmup` are there). Causal: row t never sees row t or later, so the baseline of
    a step is the same whether the trace ends there or goes on."""
    ok = ~np.isnan(logs)
    zero_row = np.zeros((1,) + logs.shape[1:])
    sums = np.concatenate([zero_row, np.cumsum(np.where(ok, logs, 0.0), axis=0)])
    counts = np.concatenate([zero_row, np.cumsum(ok, axis=0)])
    n = logs.shape[0]
    hi = np.arange(n)
    lo = np.maximum(hi - window, 0)
    s = sums[hi] - sums[lo]
    c = counts[hi] - counts[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(c >= warmup, s / np.maximum(c, 1), np.nan)
