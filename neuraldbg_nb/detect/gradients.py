"""Gradients: vanished, exploded, or not finite (per layer, weight and bias together)."""

from __future__ import annotations

import math

import numpy as np

from ..trace.columns import FROZEN, Trace
from .baseline import lagged, log_level, trailing_stats
from .ran import ran as layers_ran
from .scan import ERROR, HOLD, INFO, OK, WARNING, Finding, fmt, grade
from .thresholds import Thresholds

RECOVER = 10.0
"""A vanished gradient norm must climb above `RECOVER` x `vanish` to count as healthy
again; between the two the last state holds. A layer's gradient norm moves by up to a
decade from batch to batch, and without the band a dying layer whose norm settles at the
line (0.7-1.6e-6 against `vanish` 1e-6, with the batch) would be reported vanishing and
"back to healthy" again at every pass over its batches.
The band only keeps a reported condition: `patience` counts the steps below the line
(`Finding.hold_counts`), so a zero-initialised branch (a ResNet's last BatchNorm of each
block at weight 0, torchvision's `zero_init_residual`), whose gradients are exactly 0 at
the first step and climb through the band after it, is not vanishing. Exploding
gradients have no such band: they are reported at once, and a model whose healthy norms
are in the hundreds would stay "exploding" long after a spike."""


CLASSIC_EXPLODE = Thresholds().explode
"""The classic exploding line, 1e3: a line for the gradients of a loss averaged over the
batch, of order one."""

START_MARGIN = 10.0
"""A run's exploding line is at least this many times its largest gradient norm at the
first step (scaled as `explode` is from 1e3)."""


def explode_line(trace: Trace, th: Thresholds) -> tuple[float, int]:
    """The gradient norm above which a layer has exploded, and the layer whose norm at the
    run's first step moved it there (-1: not moved, the line is `th.explode`).

    A run whose gradients start near or above the classic line lives at another scale: a
    loss summed over the batch (`reduction="sum"`; the VAE of PyTorch's examples starts
    at 1.8e3, and its encoder's norm reaches 7.3e3 while it learns), or inputs or targets
    that were not normalised. Judged by the classic line, such a run would be an
    exploding gradient from step 0, and again each time a norm hovering at 1e3 crossed it. The line
    is `th.explode` x max(1, `START_MARGIN` x largest first-step norm / 1e3): unmoved for
    runs that start below 100, and without a step where a start a little higher would
    move it by 10x. Moving `explode` still moves it; an info event says where it is
    (`findings`). A gradient that explodes from there, and the updates it makes
    (`updates`), are still found."""
    # a loop over floats: the wake test asks at every step, right after the training step,
    # where four numpy calls on a cold cache cost about 50 us
    j, top = -1, -math.inf
    for i, x in enumerate(trace.first_grad_norm.tolist()):
        if x > top and math.isfinite(x):
            j, top = i, x
    if j < 0:
        return th.explode, -1
    factor = START_MARGIN * top / CLASSIC_EXPLODE
    if factor <= 1:
        return th.explode, -1
    return th.explode * factor, j


SLOW_MARGIN = 100.0
"""A gradient that climbed above the exploding line without a jump is exploding from this
many times the line on, however slowly it got there."""


def _exploding(g: np.ndarray, finite: np.ndarray, line: float, th: Thresholds) -> np.ndarray:
    """Codes of exploding gradients in a run that lives at its own scale (its first step's
    norms moved the line: `explode_line`): a norm above `line` within `window` steps of a
    jump above it (by `th.jump` or more over the layer's own recent level, the mean of its
    log over the last `window` steps, as for regime shifts), or above `SLOW_MARGIN` x
    `line`. In a run at the classic scale the line alone decides, wherever it is set.

    Such a run's norms grow with it: a regression on targets of order 1000 under Adam
    starts at a gradient norm of 1.3e3 and grows to 2.5e5 over 400 healthy steps, as the
    weights and activations grow to the targets' scale (Adam's steps do not grow with
    it); judged by the line alone it would be an exploding gradient at step 35 and
    eight times after. Above the line without a recent jump, the last verdict holds (HOLD). A
    gradient that climbs until it does damage is still found: by the updates it makes
    (`updates`), the loss (`loss`), or non-finite values. Before `warmup` steps of
    history, the line alone decides. Reads 2 x `window` steps of history (`history`);
    the baselines are computed only where a norm is above the line."""
    over = finite & (g > line)
    if not over.any():
        return grade(finite, (over, ERROR))
    logs = log_level(g)
    mean, _ = trailing_stats(logs, th.window, th.warmup)
    with np.errstate(invalid="ignore"):
        jumped = over & ~(logs < mean + np.log10(max(th.jump, 1.0)))  # no baseline: True
    counts = np.zeros((len(g) + 1,) + g.shape[1:], np.int64)
    np.cumsum(jumped, axis=0, out=counts[1:])
    rows = np.arange(1, len(g) + 1)
    recent = counts[rows] - counts[np.maximum(rows - 1 - th.window, 0)]  # rows r-window..r
    loud = over & ((recent > 0) | (g > line * SLOW_MARGIN))
    codes = grade(finite, (loud, ERROR))
    codes[over & ~loud] = HOLD
    return codes


def history(th: Thresholds) -> int:
    """Steps before a chunk that `findings` reads: a jump's `window` steps, each judged
    against the `window` before it (`_exploding`), and the loss's level `trend` steps
    back (`converged`)."""
    return max(2 * th.window, th.trend + th.window) + 2


CONVERGED = 1e3
"""A loss whose recent level fell this many times over the last `trend` steps is
converging, and its gradients vanish with it (`converged`)."""


def converged(trace: Trace, lo: int, stop: int, th: Thresholds) -> np.ndarray:
    """Rows where the loss's recent level (the mean of its log over the last `window`
    steps) is `CONVERGED` times or more below its level `trend` steps before: a model
    fitting exact targets, whose gradient shrinks with the residual (a linear system
    identification in float64 goes from a loss of 7.5e-5 to 1.5e-13 in 200 steps, its
    gradient from 7.3e-3 to 5.3e-7: not a vanishing gradient). Or as far below the run's
    first loss: there the residual the gradients come from is next to nothing, however
    long ago it got there (full-batch Rprop fits two spirals from 0.687 to 5e-5 in 100
    steps, before there is a level 200 steps back, and then sits at the float32 floor);
    so is a step whose own loss is (a classifier fitted exactly reads a loss of 0 at most
    steps and 1e-9 at a few: the zeros have no logarithm, and the level of the few is not
    yet known at those). Or
    a loss of exactly 0 at that step: an exact fit (a hinge loss once every margin is
    met), whose gradients are exactly 0 because nothing is left to learn, not because the
    loss does not reach the layers; judged at that step only, so a failure after it is
    judged as usual. A gradient that vanishes while the loss stays (saturated or dead
    layers) is judged as usual."""
    loss = trace.scalar("loss", lo, stop)
    logs = log_level(loss[:, None])
    level, _ = trailing_stats(logs, th.window, th.warmup)
    first = trace.first_loss
    start = np.log10(first) if np.isfinite(first) and first > 0 else np.nan
    line = -np.log10(CONVERGED)
    with np.errstate(invalid="ignore", divide="ignore"):
        return ((level - lagged(level, th.trend) <= line) | (level - start <= line))[:, 0] \
            | (loss == 0) | (np.log10(loss) - start <= line)


def starting(g: np.ndarray, lo: int, window: int) -> np.ndarray:
    """Rows where a layer's gradient is still growing from an exact zero at the run's
    first step: a layer upstream of a zero-initialised multiplier (the last BatchNorm of
    a residual block under torchvision's `zero_init_residual`, a zero-initialised head)
    gets no gradient at all until that multiplier has grown, then a gradient that climbs
    with it (a ResNet's BatchNorm: 0, 1.2e-7, 3.1e-7, 5.3e-7, ... 1.4e-5 by step 15).
    It is not vanishing. The rows: the first `window` of the run (so a live scan in
    chunks, which reads `window` + 2 rows of history, sees the same), as long as each
    step's norm is above the one before. A gradient that is 0 and stays 0 (a model
    initialised all to zeros: vanishing from step 1), or stops rising while still below
    the line, is judged as usual from there."""
    out = np.zeros(g.shape, bool)
    if lo != 0 or len(g) == 0:
        return out
    cols = np.flatnonzero(g[0] == 0)
    seg = g[:window, cols]
    if not seg.size:
        return out
    grows = np.ones(seg.shape, bool)
    with np.errstate(invalid="ignore"):  # NaN: not measured, the growth is not seen
        grows[1:] = seg[1:] > seg[:-1]
    out[:len(seg), cols] = np.logical_and.accumulate(grows, axis=0)
    return out


def _frozen(trace: Trace, lo: int, stop: int, g: np.ndarray, finite: np.ndarray,
            th: Thresholds) -> Finding:
    """Info where a layer that had gradients has none (not even zeros) for `window`
    steps while it still runs in the forward: its weights were frozen mid-run
    (`requires_grad_(False)`: a bug, or progressive freezing on purpose), or its output
    no longer reaches the loss; and where an optimizer holds a layer whose weights are
    frozen from the start (`grad_cut`'s `FROZEN`: a backbone frozen on purpose and
    handed to the optimizer with the rest, or `requires_grad_(False)` called on the
    wrong layer, which the loss would never tell). Without it nothing would be said: the
    layer's columns only go empty. Not for a layer without a gradient from the start that
    no optimizer holds (a frozen backbone left out of the optimizer), nor one that sits
    out a few steps (a head whose task is off)."""
    ran = layers_ran(trace, lo, stop)
    owned = np.array([i.has_params for i in trace.layers], bool)[None, :]
    had = np.maximum.accumulate(finite, axis=0) | (trace.col("grad_cut", lo, stop) == FROZEN)
    codes = np.where(finite, OK, np.where(np.isnan(g) & ran & owned & had, INFO, HOLD))
    return Finding("vanishing_gradient", "frozen", codes.astype(np.int8), g,
                   patience=th.window, hold_counts=False,
                   message=lambda n, s, v, p, sev: f"{n}: no gradient from step {s}, though "
                                                   f"it still runs: its weights are frozen "
                                                   f"(requires_grad off), or its output no "
                                                   f"longer reaches the loss; if it is "
                                                   f"meant to train, requires_grad_(True) "
                                                   f"on it",
                   recovery=lambda n, s, v, p, sev: f"{n}: gradient back ({fmt(v)}) at "
                                                    f"step {s}")


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    """Non-finite, exploding and vanishing gradients. A gradient of exactly 0 is told
    apart from a vanishing one: nothing of the loss reaches the layer, most often on
    purpose (an auxiliary head whose loss weight is annealed to 0), so it is a warning
    (signal "cut") that says what cuts it off, not an error that would be the run's first
    failure. Only once it has lasted `window` steps: a layer used one step in several
    (task heads trained in turn, a per-task masked loss) reads exactly 0 between its
    turns, where gradients are zeroed rather than set to None, and each head would be a
    warning that never ends."""
    g = trace.col("grad_norm", lo, stop).astype(np.float64)
    finite = np.isfinite(g)
    nonfinite = grade(~np.isnan(g), (~finite, ERROR))
    line, scaled = explode_line(trace, th)
    exploding = _exploding(g, finite, line, th) if scaled >= 0 else \
        grade(finite, (g > line, ERROR))
    # a gradient at or below the vanish line is no health for an exploding one, nor one
    # above the explode line for a vanished one: each condition ends only into health
    exploding[finite & (g < th.vanish)] = HOLD
    scale = np.full(g.shape, HOLD, np.int8)  # one info event, at the first step
    if scaled >= 0 and lo == 0 and len(g):
        scale[0, scaled] = INFO
    # judged: not in the recovery band, not a gradient still rising from 0 (`starting`)
    judged = finite & ~((g >= th.vanish) & (g < th.vanish * RECOVER)) \
        & ~starting(g, lo, th.window) & ~converged(trace, lo, stop, th)[:, None]
    zero = g == 0  # no part of the loss reaches the layer at all (signal "cut")
    tiny = (g > 0) & (g < th.vanish)
    healthy_or_low = ~(g > line)
    vanishing = grade(judged & ~zero & healthy_or_low, (tiny, ERROR))
    cut = grade(judged & ~tiny & healthy_or_low, (zero, WARNING))
    return [
        _frozen(trace, lo, stop, g, finite, th),
        Finding("nonfinite_gradient", "gradient", nonfinite, g, sticky=True, message=lambda
                n, s, v, p, sev: f"{n}: gradient became non-finite at step {s} "
                                 f"(norm was {fmt(p)})"),
        Finding("exploding_gradient", "gradient", exploding, g, message=lambda
                n, s, v, p, sev: f"{n}: gradient norm healthy ({fmt(p)}) -> exploding "
                                 f"({fmt(v)}) at step {s}"
                if not math.isnan(p) else f"{n}: gradient norm exploding ({fmt(v)}) from step {s}",
                recovery=lambda n, s, v, p, sev: f"{n}: gradient norm back to healthy "
                                                 f"({fmt(v)}) at step {s}"),
        Finding("exploding_gradient", "scale", scale, g, message=lambda
                n, s, v, p, sev: f"{n}: gradient norm {fmt(v)} at step {s}, the largest at "
                                 f"the run's first step: this run's gradients live at that "
                                 f"scale (a loss summed over the batch, or inputs or targets "
                                 f"not normalised), so they count as exploding above "
                                 f"{fmt(line)}, {START_MARGIN:g}x it, not {fmt(th.explode)} "
                                 f"(explode= moves the line)"),
        Finding("vanishing_gradient", "gradient", vanishing, g, patience=th.patience,
                hold_counts=False,
                message=lambda n, s, v, p, sev: f"{n}: gradient norm healthy ({fmt(p)}) -> "
                                                f"vanishing ({fmt(v)}) at step {s}"
                if not math.isnan(p) else f"{n}: gradient norm vanishing ({fmt(v)}) from step {s}",
                recovery=lambda n, s, v, p, sev: f"{n}: gradient norm back to healthy "
                                                 f"({fmt(v)}) at step {s}"),
        Finding("vanishing_gradient", "cut", cut, g, patience=max(th.patience, th.window),
                hold_counts=False,
                message=lambda n, s, v, p, sev: f"{n}: gradient exactly 0 from step {s}: no "
                                                f"part of the loss reaches it (a loss term "
                                                f"weighted 0 or detached, its output unused, "
                                                f"or every unit before it dead)",
                recovery=lambda n, s, v, p, sev: f"{n}: gradient back ({fmt(v)}) at step {s}"),
    ]
