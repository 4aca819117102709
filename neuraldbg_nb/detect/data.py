"""The input batch of the watched model: non-finite, all zero, constant, repeated, shifted,
drifting, raw (`raw_inputs`), from a DataLoader iterator made anew at every step.

The data is blamed first: a broken batch makes every layer look broken.
"""

from __future__ import annotations

import numpy as np

from ..trace.columns import Trace
from . import raw_inputs
from .baseline import lagged, log_level, shift_beyond, within
from .regime import describe, measured_shift, shift_codes
from .scan import ERROR, HOLD, INFO, OK, WARNING, Finding, fmt
from .thresholds import Thresholds


def _flag(values: np.ndarray, bad: np.ndarray, code: int) -> np.ndarray:
    return np.where(np.isnan(values), HOLD, np.where(bad, code, OK)).astype(np.int8)[:, None]


def _repeat_codes(repeat: np.ndarray, lo: int, window: int) -> np.ndarray:
    """A batch that repeats the one before: a warning where the loop fed other batches
    before (a loader stuck in mid-run, a sampler bug); info where every batch has been the
    same from the first (full-batch training, fitting one batch on purpose, or a loader
    never advanced, `next(iter(loader))` outside the loop: the sentence names them), and
    where it repeats no longer than batches did lately (each batch used k times: a
    warning at the second batch's repeat would stay open all run, the fresh batch between
    never enough to end it). Also info once the last `window` batches all repeated, so that a live scan, which reads
    `window` + 2 rows before its chunk and cannot see the first step after that, codes
    every row as a scan in one go does (a stuck loader's warning stays open)."""
    rep = repeat > 0
    codes = _flag(repeat, rep, WARNING)
    rows = np.arange(len(rep))
    run = rows - np.maximum.accumulate(np.where(rep, -1, rows))  # repeats ending here
    from_start = (lo == 0) & (run >= rows)  # steps 1..t all repeated (step 0 cannot)
    # the longest run of repeats in the `window` rows up to the fresh batch before this
    # run: a loop that uses each batch k times (data echoing, a few inner steps per
    # batch) repeats as it did before; a stuck loader repeats longer than ever
    padded = np.concatenate([np.zeros(window - 1), run])
    recent = np.lib.stride_tricks.sliding_window_view(padded, window).max(1)
    before = recent[np.maximum(rows - run, 0)]
    codes[rep & (from_start | (run > window) | (run <= before)), 0] = INFO
    return codes


def _repeat_message(n: str, s: int, v: float, p: float, sev: str) -> str:
    if sev == "info" and s > 1:
        return (f"input batch at step {s} repeats the previous batch exactly, as batches "
                f"did lately: each batch used several times (data echoing, inner steps)")
    if sev == "info":
        return (f"input batch at step {s} repeats the previous batch exactly, as every batch "
                f"has so far: full-batch training, or one batch fitted on purpose (a data "
                f"loader never advanced, next(iter(loader)) outside the loop, looks the same)")
    return f"input batch at step {s} repeats the previous batch exactly"


def _felt(trace: Trace, lo: int, stop: int, th: Thresholds) -> np.ndarray:
    """Rows where the model felt its input's jump: at that step a layer's output
    (abs-max), its loss or a layer's gradient norm moved by `jump` or more against its
    own recent level (beyond its noise; an output against its last measured steps), or
    none of them was measured. Any layer's output,
    not only the first in forward order's: a GAN's first layer is its generator's, and
    the real batch goes to the discriminator; a layer that only carried the input's jump
    has no regime shift of its own (`regime.follows_input`), and the input's event is
    the failure.

    A batch of heavy-tailed raw features (log-normal with sigma 3, normalised by a
    BatchNorm1d as the model's first layer) can have its abs-max jump 160x at one step
    while nothing in the model moves: a warning, not an error that would be the run's
    first failure. A batch the model feels is an error: a Linear's output 1e4x, a tanh RNN
    saturated (its output stays bounded, its gradients collapse), a loss far above its
    level."""
    act = trace.col("act_absmax", lo, stop)
    loss = trace.scalar("loss", lo, stop)[:, None]
    grad = trace.col("grad_norm", lo, stop)
    felt = np.isnan(act).all(1) & np.isnan(loss[:, 0]) & np.isnan(grad).all(1)
    shifts = [measured_shift(trace, lo, stop, th)]  # (its last measured steps: `regime`)
    shifts += [shift_beyond(log_level(v), th.window, th.warmup, th.noise)[0] for v in (loss, grad)]
    for shift in shifts:
        with np.errstate(invalid="ignore"):
            felt |= (shift >= np.log10(th.jump)).any(1)
    return felt


def _drift(absmax: np.ndarray, shift: np.ndarray, th: Thresholds
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, level, level `trend` steps before) of an input scale whose level (the mean
    of its log over the last `window` steps) moved by `jump_error` or more over `trend`
    steps without a jump: a warning. Inputs that drift by 1.06x a step (an accumulating
    transform, statistics of a normalisation computed once on other data) go from 3.7 to
    9.9e3 in 170 steps, every step within the jump line, until a half-precision layer
    overflows. A level moved by a jump within the trend (or the window its earlier level
    was read over) is the jump's event's, as the loss's trend is (`loss`)."""
    logs = log_level(absmax)
    _, base = shift_beyond(logs, th.window, th.warmup, th.noise)
    then = lagged(base, th.trend)
    moved = np.abs(base - then)
    jumped = within(shift >= WARNING, th.trend + th.window)
    with np.errstate(invalid="ignore"):
        codes = np.where(np.isnan(moved), HOLD, np.where(
            (moved >= np.log10(th.jump_error)) & ~jumped, WARNING, OK)).astype(np.int8)
    return codes, 10.0 ** base, 10.0 ** then


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    nonfinite = trace.scalar("in_nonfinite", lo, stop)
    absmax = trace.scalar("in_absmax", lo, stop)
    const = trace.scalar("in_const", lo, stop)
    repeat = trace.scalar("in_repeat", lo, stop)
    shift, base = shift_codes(absmax[:, None], th, loud=True)
    loud = shift[:, 0] == ERROR
    if loud.any():  # an error where the model felt it, a warning elsewhere (`_felt`)
        shift[loud & ~_felt(trace, lo, stop, th), 0] = WARNING
    col = lambda a: a[:, None]
    drift, level, then = _drift(col(absmax), shift, th)
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
        Finding("data_anomaly", "input_drift", drift, level, previous=then, per_layer=False,
                patience=th.patience,
                message=lambda n, s, v, p, sev: f"input batch scale drifted {_times(v, p)} "
                                                f"over {th.trend} steps by step {s} (its "
                                                f"level {fmt(p)} -> {fmt(v)}), no step a "
                                                f"jump (an accumulating transform, or "
                                                f"normalisation statistics of other data)",
                recovery=lambda n, s, v, p, sev: f"input batch scale steady again "
                                                 f"({fmt(v)}) at step {s}"),
        raw_inputs.finding(trace, lo, stop, th),
        _reiter_finding(trace.scalar("in_reiter", lo, stop), th),
    ]


def _reiter_finding(reiter: np.ndarray, th: Thresholds) -> Finding:
    """The step's batches came from a DataLoader iterator made in the step and dropped
    before its epoch ended (`record.loaders`): for `patience` steps in a row, the loop makes
    the iterator anew at every step (`next(iter(loader))` inside it), an error dated from
    the first."""
    def message(n: str, s: int, v: float, p: float, sev: str) -> str:
        epoch = "" if v == float("inf") else f" (of {v:.0f} in an epoch)"
        return (f"from step {s} on, each step's batch comes from a new DataLoader iterator, "
                f"dropped after its first batch{epoch}: next(iter(loader)) inside the loop "
                f"trains on an epoch's first batch again and again (with shuffle=True, on "
                f"one random batch a step, never a whole epoch): make the iterator once, "
                f"`for x, y in loader:` (or `it = iter(loader)` before the loop and "
                f"`next(it)` in it)")

    return Finding("data_anomaly", "input_reiter", _flag(reiter, reiter > 0, ERROR),
                   reiter[:, None], per_layer=False, patience=th.patience, message=message,
                   recovery=lambda n, s, v, p, sev: f"batches come from a DataLoader "
                                                    f"iterator kept across steps from step "
                                                    f"{s} on")


def _times(v: float, p: float) -> str:
    return f"{v / p:.0f}x up" if v >= p else f"{p / v:.0f}x down"
