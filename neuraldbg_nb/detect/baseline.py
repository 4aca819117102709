"""Each layer's own recent level, in log space: what a regime shift is measured against.

The trailing baselines depend on the trace and on `window`, `warmup` and `noise` only, not
on the jump thresholds; `Jumps` holds what they give before any threshold is applied, and
`BaselineCache` keeps it between re-classifications of one trace (the panel's sliders).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .scan import HOLD, OK

if TYPE_CHECKING:
    from ..trace.columns import Trace


def log_level(values: np.ndarray) -> np.ndarray:
    """log10 of positive finite values; NaN elsewhere (zero, negative, non-finite, missing)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log10(values, dtype=np.float64)
    np.copyto(out, np.nan, where=~(np.isfinite(values) & (values > 0)))
    return out


def lagged(a: np.ndarray, k: int) -> np.ndarray:
    """`a` moved down `k` rows (k >= 1): each row holds the value `k` rows before it, NaN
    above; what a series read `k` steps earlier."""
    out = np.full_like(a, np.nan)
    out[k:] = a[:-k]
    return out


def within(mask: np.ndarray, k: int) -> np.ndarray:
    """Where `mask` held in the row or any of the `k` - 1 rows before it (counted from the
    first row on): a jump still inside a trend that it explains (`loss`, `data`)."""
    held = np.cumsum(mask, axis=0, dtype=np.float64)
    return held - np.nan_to_num(lagged(held, k)) > 0


SCALE = 2.0 ** 20
"""Fixed-point scale of log10 values in the window sums (a millionth of a decade)."""


def trailing_stats(logs: np.ndarray, window: int, warmup: int | np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of the finite entries in the `window` rows before each
    row (NaN where fewer than `warmup` are there; a (rows, 1) array: as many as it says
    for each row). Causal: row t never sees row t or later,
    so a step's baseline is the same whether the trace ends there or goes on.

    The window sums are differences of running sums in fixed-point integers: exact (the
    int64 wrap-around cancels in the difference), so a step's baseline is bit-identical
    whichever block of rows it was computed in, live step by step or all at once."""
    ok = ~np.isnan(logs)
    scaled = logs * SCALE
    np.rint(scaled, out=scaled)
    np.copyto(scaled, 0.0, where=~ok)
    q = scaled.astype(np.int64)
    n = logs.shape[0]
    sums = np.zeros((n + 1,) + logs.shape[1:], np.int64)
    squares = np.zeros_like(sums)
    counts = np.zeros(sums.shape, np.int32)
    with np.errstate(over="ignore"):
        np.cumsum(q, axis=0, out=sums[1:])
        np.cumsum(q * q, axis=0, out=squares[1:])
    np.cumsum(ok, axis=0, out=counts[1:])
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        c = _in_window(counts, window).astype(np.float64)
        denom = np.maximum(c, 1)
        mean = np.divide(_in_window(sums, window), denom)
        mean /= SCALE
        var = np.divide(_in_window(squares, window), denom)
        var /= SCALE ** 2
        var -= np.square(mean, out=denom)
    short = c < warmup
    np.copyto(mean, np.nan, where=short)
    std = np.sqrt(np.maximum(var, 0.0, out=var), out=var)
    np.copyto(std, np.nan, where=short)
    return mean, std


def _in_window(running: np.ndarray, window: int) -> np.ndarray:
    """Window sums from running sums (row 0 all zeros): for row t, the sum over rows
    [max(t - window, 0), t), i.e. running[t] - running[max(t - window, 0)]."""
    out = running[:-1].copy()
    w = min(window, len(out))
    out[w:] -= running[: len(out) - w]  # rows before `window` subtract running[0] == 0
    return out


def shift_beyond(logs: np.ndarray, window: int, warmup: int | np.ndarray, noise: float,
                 sparse: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(|shift| against the recent level, that level) with the shift measured in decades
    beyond what the series' own noise explains: a jump must exceed `noise` standard
    deviations of the recent history to count at all. NaN where not judged.

    The recent level is the mean of the window. In the rows of `sparse` ((rows, 1) bool:
    a window whose series was measured at some of its steps only), it is also the last
    value measured in the window, and the nearer of the two counts (none where the value
    lies between them). Densely measured, the mean lies about half a window back; sparsely,
    further, and a series that grows steadily would read as a jump by the distance alone:
    logits growing 23% a step while a classifier learns, measured every 10th step, stand
    11x above the mean of their window and 8x above their last measured value. A jump from
    a level that held stands as far from both."""
    mean, std = trailing_stats(logs, window, warmup)
    shift = np.abs(logs - mean)
    if sparse is not None and sparse.any():
        last = _last_in_window(logs, window)
        near = np.abs(logs - last)
        between = np.sign(logs - last) * np.sign(logs - mean) < 0  # NaN: no last value
        use = sparse & (near < shift)
        np.copyto(shift, near, where=use)
        np.copyto(shift, 0.0, where=sparse & between)
        mean = np.where(use, last, mean)
    std *= noise
    np.multiply(shift, 0.0, out=shift, where=~(shift >= std))
    return shift, mean


def _last_in_window(logs: np.ndarray, window: int) -> np.ndarray:
    """Each row's last finite entry among the `window` rows before it, per column (NaN
    where none). Causal and exact in any block that holds the `window` rows before it."""
    rows = np.arange(len(logs))[:, None]
    seen = np.where(~np.isnan(logs), rows, -1)
    np.maximum.accumulate(seen, axis=0, out=seen)
    before = lagged(seen.astype(np.float64), 1)
    ok = (before >= 0) & (rows - before <= window)
    at = np.where(ok, before, 0).astype(np.int64)
    return np.where(ok, np.take_along_axis(logs, at, axis=0), np.nan)


@dataclass(frozen=True)
class Jumps:
    """Where a series stands out of its own recent history, before any jump threshold is
    applied: what `regime.shift_codes` grades. Only the cells that can cross a threshold
    are listed, so grading costs a copy of `judged` and a pass over the few listed cells."""

    judged: np.ndarray
    """(rows, columns) int8 codes: OK where a step can be judged (a finite positive value
    with `warmup` values before it), HOLD elsewhere."""
    at: np.ndarray
    """Flat (row-major) indices of the judged cells whose shift stands out of the noise
    (every judged cell when `everywhere`: a jump factor of 1 or less flags them all)."""
    shift: np.ndarray
    """Their shift from the recent mean, in decades."""
    level: np.ndarray
    """Their recent level (10 ** the recent level of log10, `shift_beyond`): the level a
    jump came from."""

    @property
    def nbytes(self) -> int:
        return self.judged.nbytes + self.at.nbytes + self.shift.nbytes + self.level.nbytes


def find_jumps(values: np.ndarray, window: int, warmup: int | np.ndarray, noise: float,
               everywhere: bool = False, sparse: np.ndarray | None = None) -> Jumps:
    """The `Jumps` of each column of `values` against its trailing baseline (`warmup`: as
    in `trailing_stats`; `sparse`: as in `shift_beyond`).

    A long series is taken in blocks of rows (each with the `window` rows before it),
    small enough to stay in the CPU cache: the same numbers as in one piece, since a row's
    baseline is exact whatever block it is computed in (`trailing_stats`), and faster
    (40% less time on 100 layers x 10,000 steps)."""
    n, cols = values.shape
    rows = max(BLOCK_CELLS // max(cols, 1), 8 * window)
    if n <= rows:
        return _jumps(*shift_beyond(log_level(values), window, warmup, noise, sparse),
                      everywhere)
    parts = []
    for r0 in range(0, n, rows):
        lo = max(r0 - window, 0)
        need = warmup[lo:r0 + rows] if isinstance(warmup, np.ndarray) else warmup
        part = None if sparse is None else sparse[lo:r0 + rows]
        shift, mean = shift_beyond(log_level(values[lo:r0 + rows]), window, need, noise, part)
        parts.append(_jumps(shift[r0 - lo:], mean[r0 - lo:], everywhere))
    return Jumps(np.concatenate([p.judged for p in parts]),
                 np.concatenate([p.at + i * rows * cols for i, p in enumerate(parts)]),
                 np.concatenate([p.shift for p in parts]),
                 np.concatenate([p.level for p in parts]))


def _jumps(shift: np.ndarray, mean: np.ndarray, everywhere: bool) -> Jumps:
    judged = ~np.isnan(shift)
    at = np.flatnonzero(judged if everywhere else shift > 0)
    return Jumps(np.where(judged, np.int8(OK), np.int8(HOLD)), at, shift.reshape(-1)[at],
                 10.0 ** mean.reshape(-1)[at])


BLOCK_CELLS = 2 ** 17
"""Cells per block of `find_jumps` (1 MB per float64 temporary)."""


class BaselineCache:
    """What is derived from one trace's numbers (the `Jumps` of its series), kept while the
    numbers stay as they are, so that re-classifying the same trace under other thresholds
    reuses it instead of computing the trailing baselines again.

    Entries are keyed by what they were computed from besides the trace (the column, the
    steps, `window`, `warmup`, `noise`); they all go when the trace changes (`Trace.version`:
    a step appended or filled in, a compaction) or another trace is asked about. Results
    never depend on the cache: an entry is exactly what computing it again would give.

    Size: at most `MAX_ENTRIES` entries, the least recently used dropped first. An entry
    of `Jumps` holds 1 byte per layer-step of its steps plus 24 bytes per cell that stands
    out of the noise (a small fraction on any real trace): with one set of baseline
    settings (two series, activations and gradients) about 2 bytes per layer-step of the
    exact tail, against the trace's own ~40.
    """

    MAX_ENTRIES = 4

    def __init__(self) -> None:
        self._trace: weakref.ref[Trace] | None = None
        self._version = -1
        self._entries: OrderedDict[Hashable, Jumps] = OrderedDict()

    def get(self, trace: Trace, key: Hashable, compute: Callable[[], Jumps]) -> Jumps:
        """The entry for `key` of `trace` at its current version, computed if missing."""
        if self._trace is None or self._trace() is not trace or self._version != trace.version:
            self._entries.clear()
            self._trace, self._version = weakref.ref(trace), trace.version
        found = self._entries.get(key)
        if found is None:
            found = self._entries[key] = compute()
            while len(self._entries) > self.MAX_ENTRIES:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        return found

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes held by the entries."""
        return sum(e.nbytes for e in self._entries.values())
