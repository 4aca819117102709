"""Regime shifts: a layer's activations or gradients jump against their own recent history.

Measured in log space against the trailing mean of the last `window` steps (for
activations, of those of them whose layers were measured: `MEASURED_WARMUP`), so a layer
is judged by its own scale: a 240x jump of a layer that always sat at 1e-3 is found as
surely as one of a layer at 10. A jump must also stand out of the layer's own recent
noise (`noise` standard deviations), so a layer whose per-batch gradient always swings
by a decade is not flagged for doing so. See `shift_codes` for the severities.

The gradients of a layer whose own parameters are a few numbers (`FEW`), and the
activations of a layer whose output is a few numbers, are not judged: one number crosses
zero as it settles, and its size then falls by any factor for a step (a ReZero residual
gate's gradient, a learnable temperature's, a PReLU's; the prediction of a regression
trained one sample at a time).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..trace.columns import Trace
from .baseline import BaselineCache, Jumps, find_jumps, log_level, shift_beyond, trailing_stats
from .scan import ERROR, HOLD, INFO, OK, WARNING, Finding, Message, fmt
from .thresholds import Thresholds

FEW = 16
"""Layers with fewer elements than this in their own parameters have no gradient regime
shifts, and those with a call that output fewer have no activation regime shifts. A
ReZero gate (one number, initialised at 0) can read 0.196 -> 0.0012 at one step of
healthy training as it crosses zero, a 162x collapse; an online regression's output (one
number a step) can "collapse 958x". The size of a few dozen numbers does not fall to
nothing unless all of them do."""


GRADIENT_PATIENCE = 2
"""Steps a gradient's jump must hold to be a regime shift. A gradient that jumps for one
step and is back at the next is the batch, not the layer: in a mixture of experts, an
expert routed one easy token has its gradient fall 100-10,000x for that step, many times
in a healthy training. A layer that collapsed stays collapsed, and is reported
at the step it began. Steps where the layer had no gradient (an expert routed no token)
are no evidence either way: they do not count. Activations keep a patience of 1: a jump
there is loud at once."""


def shift_codes(values: np.ndarray, th: Thresholds, loud: bool,
                jumps: Jumps | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(codes, baseline level) of a jump against each column's own recent history.

    Loud signals (activations, the input) warn from `jump` and are errors from
    `jump_error`; quiet ones (gradients, which jump as a symptom of almost anything and
    swing by decades on healthy batches near a perfect fit) are info from `jump` and
    warnings from `jump_error`. The level is given where a jump stands out of the noise
    (NaN elsewhere: an event reads it only at a step where a jump starts). `jumps`: the
    series' `find_jumps` under these thresholds' baseline settings, if already known."""
    if jumps is None:
        jumps = find_jumps(values, *baseline_settings(th))
    codes = jumps.judged.copy()
    flat = codes.reshape(-1)
    flat[jumps.at[jumps.shift >= np.log10(th.jump)]] = WARNING if loud else INFO
    flat[jumps.at[jumps.shift >= np.log10(max(th.jump, th.jump_error))]] = (
        ERROR if loud else WARNING)
    level = np.full(codes.shape, np.nan)
    level.reshape(-1)[jumps.at] = jumps.level
    return codes, level


def held_jumps(values: np.ndarray, codes: np.ndarray, level: np.ndarray, th: Thresholds,
               rows: int) -> None:
    """Extend a quiet signal's jumps (graded as `shift_codes` does for gradients) to the
    `rows` steps after them, in place: each such step whose value still stands `jump` or
    more beyond the level the jump came from, in the same direction, gets the jump's code
    (or a milder one, by its own size) and level, so a jump that holds meets a patience of
    `rows` + 1. Judged against its own recent history instead, the step after a jump has
    a baseline holding the jump itself, whose spread hides it: a conv layer's gradient,
    0.2 for 20 steps, reads 536, 88 and 39 after its weights are zeroed (2300x, 380x,
    170x its level), and only the first step would stand out. Causal: a step reads the one
    before it."""
    if th.jump <= 1:  # every judged step is listed already (`shift_codes`)
        return
    lo_line, hi_line = np.log10(th.jump), np.log10(max(th.jump, th.jump_error))
    logs = log_level(values)
    src = np.argwhere(codes[:-1] >= INFO) if len(codes) > 1 else np.zeros((0, 2), np.int64)
    for _ in range(rows):
        if not len(src):
            return
        r, c = src[:, 0], src[:, 1]
        base = np.log10(level[r, c])
        up = logs[r, c] > base
        shift = np.where(up, 1.0, -1.0) * (logs[r + 1, c] - base)  # NaN: no value, not held
        code = np.where(shift >= hi_line, WARNING, np.where(shift >= lo_line, INFO, OK))
        code = np.minimum(code, codes[r, c])
        new = (code > codes[r + 1, c]) & (codes[r + 1, c] != HOLD)
        r, c = r[new] + 1, c[new]
        codes[r, c] = code[new]
        level[r, c] = level[r - 1, c]
        keep = r < len(codes) - 1
        src = np.stack([r[keep], c[keep]], axis=1)


def _revived(grad: np.ndarray, level: np.ndarray, th: Thresholds) -> np.ndarray:
    """Gradient jumps up from a level below the vanishing line: not a regime shift. The
    gradient comes back (a dead layer revived), and one that goes on to explode is judged
    by the exploding line. At an exact fit gradients sit near nothing: full-batch Rprop at
    the float32 floor (loss 3e-10) reads 1e-7 -> 8e-3 in all four layers when the loss
    blips to 4e-6, which would be four warnings beside the loss's own."""
    with np.errstate(invalid="ignore"):
        return (level < th.vanish) & (grad > level)


def per_module(trace: Trace, lo: int, values: np.ndarray,
               judge: Callable[[np.ndarray], tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """`judge(values)` (steps `lo` on; it returns (steps, layers) arrays), where a layer
    the loop replaced inside the watch (`LayerInfo.since`) is judged from its module's
    arrival on against that module's own history only: a new head's gradient is not a
    jump from the old head's. Its steps before are judged as they were."""
    out = judge(values)
    cut = [(j, i.since - lo) for j, i in enumerate(trace.layers)
           if lo < i.since < lo + len(values)]
    if not cut:
        return out
    own = values.copy()
    for j, rows in cut:
        own[:rows, j] = np.nan
    for a, b in zip(out, judge(own)):
        for j, rows in cut:
            a[rows:, j] = b[rows:, j]
    return out


def few(trace: Trace, field: str) -> list[int]:
    """The layers with fewer than `FEW` numbers in `field` (`LayerInfo.params` or
    `LayerInfo.outputs`; -1, not recorded, is not few)."""
    return [j for j, i in enumerate(trace.layers) if 0 <= getattr(i, field) < FEW]


def converging(trace: Trace, lo: int, stop: int, th: Thresholds) -> np.ndarray:
    """Steps whose loss fell by `jump` or more below its own recent level (the mean of its
    log over the last `window` steps): there the gradients shrinking with it is the
    optimizer converging, not a collapse. A second-order or full-batch optimizer does it
    in a few steps: L-BFGS after Adam on a physics-informed net takes the loss from 1.5e-3
    to 2.5e-5, and every layer's gradient falls 1000x at one step. Causal,
    and exact whatever block of rows it is computed in (`trailing_stats`)."""
    loss = log_level(trace.scalar("loss", lo, stop)[:, None])
    mean, _ = trailing_stats(loss, th.window, th.warmup)
    with np.errstate(invalid="ignore"):
        return (loss <= mean - np.log10(th.jump))[:, 0]


def baseline_settings(th: Thresholds) -> tuple[int, int, float, bool]:
    """The arguments of `find_jumps` under `th`: the only settings its result depends on."""
    return th.window, th.warmup, th.noise, th.jump <= 1


def zeroed(trace: Trace, act: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Where a layer with parameters of its own outputs exactly 0 within `window` steps of
    a nonzero output, and that output's abs-max: (mask, was). A LayerNorm whose weight and
    bias are zeroed reads 4.77 -> 0, which a baseline in log space cannot see (log 0):
    without this the next layer, fed its zeros, would be blamed at that step, and the
    LayerNorm only at the next.
    Layers without parameters (a ReLU all of whose units are off, a drop-path that drops a
    whole batch) output zeros in healthy training; dead units are judged apart. The
    look-back is bounded so that a live scan, which reads `window` steps before its
    chunk, finds the same."""
    rows = np.arange(len(act))[:, None]
    seen = np.isfinite(act) & (act > 0)
    last = np.maximum.accumulate(np.where(seen, rows, -1), axis=0)
    owned = np.array([i.has_params for i in trace.layers], bool)[None, :]
    mask = (act == 0) & owned & (last >= 0) & (rows - last <= window)
    was = np.take_along_axis(act, np.maximum(last, 0), axis=0)
    return mask, was


def describe(what: str) -> Message:
    """The sentence of a jump or a collapse of `what`."""
    def message(n: str, s: int, v: float, p: float, sev: str) -> str:
        who = f"{n}: {what}" if n else what
        if v == 0:
            return f"{who} became exactly 0 at step {s} (was {fmt(p)})"
        factor = v / p if p > 0 else float("inf")
        if factor >= 1:
            return f"{who} jumped {factor:.0f}x at step {s} ({fmt(p)} -> {fmt(v)})"
        return f"{who} collapsed {1 / factor:.0f}x at step {s} ({fmt(p)} -> {fmt(v)})"
    return message


FOLLOWS = 2.0
"""A layer's activations that jump by no more than this times the factor the input batch
jumped by at the same step (in the same direction) only carried the input's jump."""


def follows_input(trace: Trace, lo: int, stop: int, act: np.ndarray, base: np.ndarray,
                  th: Thresholds) -> np.ndarray:
    """(rows, layers) mask of activation jumps that the input batch's own jump at that
    step explains: the input's abs-max moved `jump` or more against its own recent level
    (the mean of its log over `window` steps), and the layer's output by at most `FOLLOWS`
    times as much, the same way. A heavy-tailed feature batch (abs-max 160x its usual) moves
    a Linear's output by the same 160x: that is the data's event (`data`, "input_scale"),
    not a regime shift of the layer."""
    logs = log_level(trace.scalar("in_absmax", lo, stop)[:, None])
    mean, _ = trailing_stats(logs, th.window, th.warmup)
    moved = logs - mean
    with np.errstate(invalid="ignore", divide="ignore"):
        layer = log_level(act) - np.log10(base)
        return ((np.abs(moved) >= np.log10(th.jump)) & (np.sign(layer) == np.sign(moved))
                & (np.abs(layer) <= np.abs(moved) + np.log10(FOLLOWS)))


MEASURED_WARMUP = 2
"""Measured values in a layer's `window` that its activations are judged against, where
the layer hooks skipped steps of it (no layer's output measured; they are never more than
`trace.HOOK_GAP` apart, so a window of 20 steps holds two measured steps) and `warmup`
asks for more: two levels of the layer's own within the window are enough for a jump of
`jump` (10x) to stand out. A level counted over more measured steps would reach far back,
and a layer whose output grows steadily (8% a step while a model fits) would read as a
jump. A window measured throughout asks for `warmup`. Where the window skipped steps,
the level is also read from the last measured step (`baseline.shift_beyond`, `sparse`)."""


def _measured_warmup(act: np.ndarray, th: Thresholds) -> tuple[np.ndarray, np.ndarray]:
    """(need, sparse), each (steps, 1): the values each step's activation baseline needs
    (`MEASURED_WARMUP`: fewer where a step of its window has no layer's output measured),
    and where that is so."""
    skipped = np.zeros(len(act) + 1, np.int64)  # unmeasured steps before each step
    np.cumsum(np.isnan(act).all(axis=1), out=skipped[1:])
    rows = np.arange(len(act))
    inside = skipped[rows] - skipped[np.maximum(rows - th.window, 0)]
    sparse = (inside > 0)[:, None]
    return np.where(sparse, min(th.warmup, MEASURED_WARMUP), th.warmup), sparse


def measured_shift(trace: Trace, lo: int, stop: int, th: Thresholds) -> np.ndarray:
    """(steps, layers) each layer's activation shift beyond its noise (`shift_beyond`, in
    decades) against its measured steps in the `window` before; NaN where not judged."""
    act = trace.col("act_absmax", lo, stop)
    need, sparse = _measured_warmup(act, th)
    return per_module(trace, lo, act, lambda a: shift_beyond(
        log_level(a), th.window, need, th.noise, sparse))[0]


def activation_findings(trace: Trace, lo: int, stop: int, th: Thresholds,
                        baselines: BaselineCache | None = None) -> list[Finding]:
    """Activation regime shifts, each layer judged against its own measured steps in the
    `window` before (`MEASURED_WARMUP`). `baselines`: as in `gradient_findings`."""
    act = trace.col("act_absmax", lo, stop)  # float32: the sums are taken in float64
    settings = window, _, noise, everywhere = baseline_settings(th)
    need, sparse = _measured_warmup(act, th)

    def compute() -> Jumps:
        return find_jumps(act, window, need, noise, everywhere, sparse)

    jumps = _cached(baselines, trace, "act_absmax", lo, stop, settings, compute) or compute()
    codes, base = per_module(trace, lo, act, lambda a: shift_codes(
        a, th, True, jumps if a is act else find_jumps(a, window, need, noise, everywhere,
                                                       sparse)))
    codes[(codes >= WARNING) & follows_input(trace, lo, stop, act, base, th)] = OK
    zero, was = zeroed(trace, act, th.window)
    codes[zero] = ERROR
    base[zero] = was[zero]
    codes[:, few(trace, "outputs")] = HOLD
    return [Finding("regime_shift", "activation", codes, act, previous=base,
                    message=describe("activations (abs-max)"))]


def _cached(baselines: BaselineCache | None, trace: Trace, name: str, lo: int, stop: int,
            settings: tuple[int, int, float, bool], compute: Callable[[], Jumps]
            ) -> Jumps | None:
    """The `Jumps` of column `name` (steps `lo` to `stop`, under `settings`), kept in
    `baselines` for the next re-classification; None where not kept."""
    if baselines is None or settings[-1]:  # a jump of 1x or less lists every cell: not kept
        return None
    return baselines.get(trace, (name, lo, stop, *settings), compute)


def gradient_findings(trace: Trace, lo: int, stop: int, th: Thresholds,
                      baselines: BaselineCache | None = None) -> list[Finding]:
    """Gradient regime shifts, against the `window` steps before (gradients are read at
    every step). `baselines`: where to keep the threshold-free part (`Jumps`) for the next
    call on the same trace and steps (a re-classification); the result is the same
    without."""
    grad = trace.col("grad_norm", lo, stop)
    settings = baseline_settings(th)
    jumps = _cached(baselines, trace, "grad_norm", lo, stop, settings,
                    lambda: find_jumps(grad, *settings))
    grad_codes, grad_base = per_module(trace, lo, grad, lambda g: shift_codes(
        g, th, False, jumps if g is grad else None))
    held_jumps(grad, grad_codes, grad_base, th, GRADIENT_PATIENCE - 1)
    grad_codes[_revived(grad, grad_base, th)] = OK
    grad_codes[:, few(trace, "params")] = HOLD
    rows = np.flatnonzero(converging(trace, lo, stop, th))
    if len(rows):
        codes = grad_codes[rows]
        codes[grad[rows] < grad_base[rows]] = OK
        grad_codes[rows] = codes
    return [Finding("regime_shift", "gradient", grad_codes, grad, previous=grad_base,
                    message=describe("gradient norm"), patience=GRADIENT_PATIENCE,
                    hold_counts=False)]
