"""When a live run should scan now rather than later.

Scanning every step would cost milliseconds of host time per step; the live run scans in
batches instead (the result is the same: the scan is chunk-invariant). This test of the
newest step against the one before decides when to scan at once, so that a sudden
failure is found, captured and stopped at the step it happens: something turned
non-finite, a gradient crossed the vanish or explode line, a dead or saturated fraction
crossed its line (against the last two sampled steps), the input turned non-finite or
all zero, the gradients were carried over (no zero_grad) or missing at the optimizer's
step a second step in a row, a layer's gradients reached no optimizer, weights changed
outside the optimizer by `max_update` of their size before the step's forward, or a
number moved by `sqrt(jump)` or more (gradients: `sqrt(jump_error)`; the loss: a rise of
`sqrt(loss_rise)`). It only decides *when* detection runs, never *what* it finds; a slow
drift is found at the next batch.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import numpy as np

from ..trace.columns import UNTRAINED_MODEL, Trace
from .gradients import SLOW_MARGIN, explode_line
from .ran import hooked
from .thresholds import Thresholds


def wake(trace: Trace, th: Thresholds, measured: bool = True) -> frozenset[str]:
    """Whether the newest step may start an event (judged on the columns measured every
    step; sampled ones are compared by `SampledWake`), as the set of reasons to scan:
    empty if none; "sudden" where an event would be reported at this step (scan now);
    "slow" where one is reported only after holding for a while (a gradient crossing the
    vanish line: scan again `patience` steps later); "jump" for a gradient's move alone,
    which is a regime shift only once it has held for `GRADIENT_PATIENCE` steps (scan
    then, if it held: `jump_held`); "rise" for the loss rising, which must hold too (scan
    `patience` steps later, if it held: `rise_held`). A value's move of `f` decades or
    more, |log10(now / before)| >= f, is read as now / before outside (10**-f, 10**f)
    (`_bands`). The loss is only judged upward (only a rise is a failure), from
    `sqrt(loss_rise)`: a noisy loss near its minimum falls and rises by several times
    from batch to batch.

    It runs after every step of a live run, right after the training step has emptied the
    CPU's caches, so it reads the two rows as Python floats and compares them in plain
    loops: as whole-row numpy ops, each call paying its cold start, it costs more than
    twice as much a step. From `WIDE` layers on, the loops cost more: there it compares
    arrays (`_Rows`). `measured`: False where the caller knows that the newest step's
    layer outputs were not measured (its hooks were off): no activations are compared."""
    t = trace.n_steps - 1
    if t < 0:
        return NONE
    if _unheld_anew(trace, t):
        return SUDDEN
    # the first step against unknown values (NaN): what is wrong in itself wakes (a value
    # not finite or past its line, an input all zero), no move can
    lo, two = (t - 1, _same) if t else (0, _after_unknown)
    rows = _Rows(trace.n_layers >= WIDE)
    # activations where both steps were hooked (`ran.hooked`); a hooked step after unhooked
    # ones is compared with the last hooked one by the live schedule (`live.scans`)
    act_b, act = rows.of(two(trace.col("act_absmax", lo, t + 1))) \
        if measured and hooked(trace, lo, t + 1).all() else rows.none
    grad_b, grad = rows.of(two(trace.col("grad_norm", lo, t + 1)))
    # the weight norm after an update reaches the trace with the next step: one step back
    w_b, w = rows.of(trace.col("param_norm", t - 2, t)) if t >= 2 else rows.none
    (loss_b, loss), (in_b, in_now), (inf_b, inf) = (two(trace.scalar(c, lo, t + 1)).tolist()
                                                     for c in _SCALARS)
    jump, grad_jump, rise = _bands(th.wake_jump, th.jump, th.jump_error, th.loss_rise)
    line = explode_line(trace, th)[0]
    loss_moved = _moved(loss_b, loss, rise, -1.0)  # a fall never wakes (-1: q <= -1 < 0)
    rose = loss_moved and math.isfinite(loss)  # a divergence must hold a while
    if (rows.moved(act_b, act, *jump) or rows.moved(w_b, w, *jump)
            or (loss_moved and not rose) or _moved(in_b, in_now, *jump)
            or any(rows.rose_past(grad_b, grad, y)  # (`gradients._exploding`)
                   for y in (line, line * SLOW_MARGIN))
            or (inf > 0 and not inf_b > 0) or (in_now == 0 and in_b != 0)
            or _anew(trace, "grad_carried", t) or _anew(trace, "grads_missing", t)
            or rows.reached(trace.col("w_edited", t, t + 1)[0], th.max_update)):
        return SUDDEN
    vanished = rows.fell_past(grad_b, grad, th.vanish)
    jumped = rows.moved(grad_b, grad, *grad_jump)
    return _REASONS[vanished, jumped, rose]


WIDE = 32
"""Layers from which `wake` compares the two rows as arrays. Below it, plain loops over
Python floats are faster right after a training step, where each numpy call pays a cold
start; above it the loops' cost per layer wins (121 layers: about 170 us a call in
loops, 115 in arrays, the rest being the trace reads both pay)."""


class _Rows:
    """Two steps' per-layer values, and `wake`'s comparisons of them: as lists of Python
    floats in plain loops, or, for `WIDE` models, as float64 arrays; the same answers
    (NaN compares false, as in the loops)."""

    def __init__(self, wide: bool) -> None:
        self.wide = wide
        self.none: tuple[Any, Any] = (np.zeros(0), np.zeros(0)) if wide else ([], [])

    def of(self, two: np.ndarray) -> tuple[Any, Any]:
        """The rows of a (2, layers) slice of the trace."""
        if self.wide:
            wide = two.astype(np.float64)
            return wide[0], wide[1]
        before, now = two.tolist()
        return before, now

    def moved(self, before: Any, now: Any, hi: float, lo: float) -> bool:
        """Did any layer's value move out of (lo, hi) times what it was (`_moved`)?"""
        if not self.wide:
            return any(_moved(b, x, hi, lo) for b, x in zip(before, now))
        with np.errstate(divide="ignore", invalid="ignore"):
            q = now / before  # x / 0: inf with x's sign; 0 / 0: NaN, which moves nothing
            hit = (np.isinf(now) & ~np.isinf(before)) | (q >= hi) | ((q >= 0) & (q <= lo))
        return bool(hit.any())

    def reached(self, row: np.ndarray, line: float) -> bool:
        """Is any layer's value of one step's `row` at `line` or above?"""
        if not self.wide:
            return any(x >= line for x in row.tolist())
        return bool((row >= line).any())

    def rose_past(self, before: Any, now: Any, line: float) -> bool:
        """Did any layer's value go above `line` from not above it?"""
        if not self.wide:
            return any(x > line and not b > line for b, x in zip(before, now))
        return bool(((now > line) & ~(before > line)).any())

    def fell_past(self, before: Any, now: Any, line: float) -> bool:
        """Did any layer's value go below `line` from not below it?"""
        if not self.wide:
            return any(x < line and not b < line for b, x in zip(before, now))
        return bool(((now < line) & ~(before < line)).any())


SUDDEN, NONE = frozenset({"sudden"}), frozenset[str]()
_REASONS = {(v, j, r): frozenset(k for k, on in (("slow", v), ("jump", j), ("rise", r)) if on)
            for v in (False, True) for j in (False, True) for r in (False, True)}
"""`wake`'s answers other than "sudden", built once: by (vanished, jumped, rose)."""


def jump_held(trace: Trace, th: Thresholds, at: int) -> bool:
    """Whether a gradient that moved at step `at` ("jump" from `wake`) may have started a
    regime shift that a scan now would report: some layer's gradient stood `jump` or more
    beyond its level before `at` (10 ** the mean of its log over the `window` steps
    before), in the same direction, at `at` and at the steps after it up to the newest
    that have one (what the gradient detector needs before its noise test, held for its
    `GRADIENT_PATIENCE`). A gradient swings by a decade from one batch to the next near
    a perfect fit (an MLP that memorises its few batches does so several times in a few
    hundred steps, each time for one step). Only when the scan runs depends on it: what a
    skipped one would have found, the next batch scan finds."""
    lo = max(at - th.window, trace.full_from)
    need = math.log10(th.jump) - 1e-9  # (the detector's means are fixed-point)
    k = at - lo
    if trace.n_layers >= WIDE:  # (`_Rows`): the layers' columns as arrays
        return _jump_held_wide(trace.col("grad_norm", lo, trace.n_steps), k, need, th)
    for col in trace.col("grad_norm", lo, trace.n_steps).T.tolist():
        logs = _logs(col)
        first, level = logs[k], _level(logs, k, th)
        if first is None or level is None:
            continue
        sign = 1.0 if first > level else -1.0
        after = [x for x in logs[k + 1:] if x is not None]  # no gradient: no evidence
        if after and all(sign * (x - level) >= need for x in [first, *after]):
            return True
    return False


def _jump_held_wide(rows: np.ndarray, k: int, need: float, th: Thresholds) -> bool:
    """`jump_held` over a (steps, layers) slice of the gradient norms whose row `k` is the
    jump's, in whole-column ops: the same answers (`_logs`, `_level`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        g = rows.astype(np.float64)
        logs = np.where((g > 0) & (g < math.inf), np.log10(g), np.nan)
        past = logs[max(k - th.window, 0):k]
        known = (~np.isnan(past)).sum(axis=0)
        level = np.nansum(past, axis=0) / known
        first, after = logs[k], logs[k + 1:]
        sign = np.where(first > level, 1.0, -1.0)
        heard = ~np.isnan(after)
        stood = (sign * (after - level) >= need) | ~heard
        held = ((known >= th.warmup) & ~np.isnan(first) & heard.any(axis=0)
                & (sign * (first - level) >= need) & stood.all(axis=0))
    return bool(held.any())


def rise_held(trace: Trace, th: Thresholds, risen: int) -> bool:
    """Whether the loss that rose at step `risen` ("rise" from `wake`) may have started a
    divergence that a scan now would report: two steps in a row from the one before
    `risen` on (a loss already up may have risen again), each `loss_rise` above the mean
    of the log-losses of the `window` steps before it (or the second one not judged: a
    loss that is not finite and positive, too few steps before it), which is what the
    loss detector's jump needs before its noise test and its `patience` of two. Near its
    minimum a loss rises by `sqrt(loss_rise)` from batch to batch (an MLP that memorises
    its few batches, at a loss of 0.002-0.1, does so dozens of times in a few hundred
    steps), and each rise would cost a scan of a few ms. Only when the scan runs depends on it: what a skipped
    one would have found, the next batch scan finds."""
    lo = max(risen - 1 - th.window, trace.full_from)
    logs = _logs(trace.scalar("loss", lo, trace.n_steps).tolist())
    need = math.log10(th.loss_rise) - 1e-9  # (the detector's means are fixed-point)
    up: list[bool | None] = []  # None: not judged
    for t in range(max(risen - 1 - lo, 0), len(logs)):
        now, level = logs[t], _level(logs, t, th)
        up.append(None if now is None or level is None else now - level >= need)
    return any(a and b is not False for a, b in itertools.pairwise(up))


def _logs(values: list[float]) -> list[float | None]:
    """log10 of the positive finite values, None elsewhere: `_baseline.log_level` for the
    few floats the two tests above read, without numpy's cold start."""
    return [math.log10(x) if 0 < x < math.inf else None for x in values]


def _level(logs: list[float | None], t: int, th: Thresholds) -> float | None:
    """The mean of the known logs in the `window` entries before `t`, None where fewer
    than `warmup` are known: `_baseline.trailing_stats`' mean, for one entry."""
    past = [x for x in logs[max(t - th.window, 0):t] if x is not None]
    return sum(past) / len(past) if len(past) >= th.warmup else None


def _moved(before: float, now: float, hi: float, lo: float) -> bool:
    """Did a value move out of (lo, hi) times what it was, or turn infinite? As numpy
    divides: x / 0 is inf with x's sign (NaN for 0 / 0), and NaN moves nothing."""
    if math.isinf(now) and not math.isinf(before):
        return True
    try:
        q = now / before
    except ZeroDivisionError:
        if now == 0 or math.isnan(now):
            return False
        q = math.copysign(math.inf, now) * math.copysign(1.0, before)
    return q >= hi or 0 <= q <= lo


def _anew(trace: Trace, column: str, t: int) -> bool:
    """A mistake of the loop (gradients carried over, or missing at the step) at steps
    t-1 and t, and not at t-2 (nor where t-2 is before the first step: a mistake from the
    first step on): the two steps that make it an error (see `loop`), just completed."""
    c = trace.scalar(column, max(t - 2, 0), t + 1).tolist()
    c = [math.nan] * (3 - len(c)) + c
    return c[1] > 0 and c[2] > 0 and not c[0] > 0


def _same(rows: np.ndarray) -> np.ndarray:
    return rows


def _after_unknown(rows: np.ndarray) -> np.ndarray:
    """The first step's row, after a row of unknown values (NaN)."""
    return np.concatenate([np.full_like(rows, np.nan), rows])


def _unheld_anew(trace: Trace, t: int) -> bool:
    """A layer whose weights got gradients that no optimizer holds at step t, and not at
    t-1 (`membership`: an error at its first step)."""
    rows = trace.col("grad_unheld", max(t - 1, trace.full_from), t + 1).tolist()
    now = rows[-1]  # (floats in a loop: see `wake`)
    bad = [x > 0 and x != UNTRAINED_MODEL for x in now]
    if not any(bad):
        return False
    return len(rows) == 1 or any(b and x != y for b, x, y in zip(bad, now, rows[0]))


_SCALARS = ("loss", "in_absmax", "in_nonfinite")
"""Per-step columns read by `wake`: the first two are compared like the layers' values."""


@functools.lru_cache(maxsize=8)
def _bands(wake_jump: float, jump: float, jump_error: float,
           loss_rise: float) -> tuple[tuple[float, float], tuple[float, float], float]:
    """(10**f, 10**-f) for the activations, weights and input, then for the gradients,
    then 10**f for the loss (`wake`): half the jump in decades for the gradients, which
    swing by a decade on ordinary batches and only warn from `jump_error`; half
    `loss_rise` in decades for the loss, which wakes on a rise only. Keyed by the four
    floats: hashing the whole `Thresholds` costs about 15 us a step."""
    f = math.log10(wake_jump)
    g = 0.5 * math.log10(max(jump, jump_error))
    return (10.0 ** f, 10.0 ** -f), (10.0 ** g, 10.0 ** -g), 10.0 ** (0.5 * math.log10(loss_rise))


class SampledWake:
    """The same test for the sampled columns (dead units, saturation), against the last
    two sampled steps rather than the step before, which was not measured: a layer wakes
    the scan when its fraction crosses the line after two samples below it. A layer that
    hovers at the line (a deep ReLU stack's half-dead layers) flips from sample to sample;
    waking on each flip would scan twice every sampled step. Its event, a slow condition, is
    still found by the next batch scan.

    It answers with the layers that crossed: their tensors are held at a sampled step
    (`Probe`), and the watch captures them there, so that the event, reported
    `patience` steps later at this step, opens on the layer's own input and output; by
    then a CPU activation is no longer held (a dead-units first failure would open on
    the input batch alone)."""

    def __init__(self) -> None:
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # the two last samples

    def __call__(self, trace: Trace, th: Thresholds) -> list[int]:
        t = trace.n_steps - 1
        if t < 0 or not trace.scalar("sampled", t, t + 1)[0] > 0:
            return []
        with np.errstate(invalid="ignore"):
            now = np.concatenate([trace.col("dead_frac", t, t + 1)[0] >= th.dead,
                                  trace.col("sat_frac", t, t + 1)[0] >= th.saturated])
        last = self._last
        if last is None or len(last[1]) != len(now):
            self._last = (np.zeros_like(now), now)
            crossed = now
        else:
            self._last = (last[1], now)
            crossed = now & ~(last[0] | last[1])
        return sorted({int(j) % trace.n_layers for j in np.flatnonzero(crossed)})
