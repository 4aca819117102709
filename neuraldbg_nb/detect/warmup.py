"""A warm-up that never ends: the learning rate rises steadily past what the model bears.

A linear warm-up written without its cap (`LambdaLR(opt, lambda s: (s + 1) / 10)`) raises
the learning rate a little every step, for ever. No single move is large enough to be an
`lr_change`, and for a while the model trains well; then the updates grow to a sizeable
share of the weights, the loss turns up, and some steps later activations and gradients
blow up. The blow-up is a symptom: the failure began where the updates outgrew the
weights while the rate was still rising, and that is where it is named (`findings`), with
the rate's path. Under Adam, whose steps do not grow with the weights, the updates may
stay under a tenth of them while the loss climbs back for good: named where its level
over a window has doubled at a rate well past the one it was best at. Where neither can
be seen (no loss recorded, a failure of another kind
first), the rise is still said as the first failure's likely cause (`causes`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..trace.columns import Trace
from .baseline import lagged
from .regime import few
from .scan import ERROR, HOLD, OK, Finding, fmt
from .thresholds import Thresholds
from .updates import GROWING, growing, lr_of

RISE = 10.0
"""The factor by which the learning rate has to have risen, from its first positive value,
to be a rise (`rise`)."""
STEADY_RISE = 0.9
"""Fraction of the steps of a rise at which the learning rate did not fall."""
ONE_MOVE = 0.5
"""The largest share of a rise (in decades) that one step's move may make: a rate raised
100x at once is a move (`lr_change`), not a rise; a warm-up's first step doubles the
rate, 0.3 of the decade it has risen by 10x."""
OUTGROW = 0.1
"""An update that moves a layer's weights by this share of their size or more has outgrown
them: the weights are replaced in ten such steps. Healthy training moves them by about
1e-3 of their size a step, a fast start by 1e-2."""
LOSS_UP = 2.0
"""How many times its lowest level since the rise began the loss's level must reach to
have turned up (the level: the median of `LEVEL_STEPS` steps, so that one bad batch of a
fitted model, 100x its neighbours, is not a turn)."""
LEVEL_STEPS = 5
"""Steps of the loss whose median is its level, against one bad batch (`LOSS_UP`)."""
LARGE = 0.01
"""An update of this share of the weights is large (ten times a healthy one): where the
updates stay under `OUTGROW` (Adam's steps against weights that grow, LayerNorm after
them), a loss that has turned up over a whole `window` (the median of `window` steps twice
its best since the rise began, or more) at a learning rate `PAST_BEST` times the one it was
best at, with updates this large, is the rise's doing too."""
PAST_BEST = 1.25
"""How many times the learning rate it was best at the rate must be, for a loss turned up
over a window under updates below `OUTGROW` to be the rise's doing (`LARGE`)."""


@dataclass(frozen=True)
class Rise:
    """The learning rate's steady rise up to a step: its steps and values from the first
    positive one."""

    steps: np.ndarray
    lr: np.ndarray

    @property
    def factor(self) -> float:
        return float(self.lr[-1] / self.lr[0])

    @property
    def path(self) -> str:
        """Its first value, the value halfway and the last, with their steps."""
        mid = int(np.searchsorted(self.steps, (self.steps[0] + self.steps[-1]) / 2))
        return " -> ".join(f"{fmt(self.lr[i])} at step {self.steps[i]}"
                           for i in (0, mid, len(self.lr) - 1))


def rise(trace: Trace, step: int, lookback: int) -> Rise | None:
    """The learning rate's rise up to `step`, where it rose `RISE` times or more from its
    first positive value, did not fall at `STEADY_RISE` of the steps, no step's move made
    more than `ONE_MOVE` of it, and it still rose in the `lookback` steps up to `step`;
    None otherwise, and where fewer than 2 `lookback` positive values were read. Read
    from the trace's whole history."""
    steps, lr = trace.history("lr")
    keep = (steps <= step) & np.isfinite(lr)
    steps, lr = steps[keep], lr[keep].astype(np.float64)
    positive = np.flatnonzero(lr > 0)
    if len(positive) < 2 * lookback:
        return None
    steps, lr = steps[positive[0]:], lr[positive[0]:]
    recent = lr[steps >= step - lookback]
    with np.errstate(divide="ignore", invalid="ignore"):
        moves = np.diff(np.log10(lr))
    if not (lr[-1] >= RISE * lr[0] and len(recent) > 1 and recent[-1] > recent[0]
            and np.mean(moves >= 0) >= STEADY_RISE
            and moves.max() <= ONE_MOVE * np.log10(lr[-1] / lr[0])):
        return None
    return Rise(steps, lr)


@dataclass(frozen=True)
class Turn:
    """The loss's level at a step against its lowest since a rise began."""

    low: float
    now: float
    low_step: int
    """The last step of the window whose level was the lowest."""


def _turned_up(trace: Trace, since: int, step: int, width: int) -> Turn | None:
    """The loss's level at `step` (the median of its `width` steps up to it) against the
    lowest such level read from `since` on, where it is `LOSS_UP` times that or more and
    that is above 0; None otherwise and where the trace holds too few losses."""
    lo = max(since, trace.full_from)
    if step + 1 - lo < 2 * width:
        return None
    loss = trace.scalar("loss", lo, step + 1).astype(np.float64)
    levels = np.median(np.lib.stride_tricks.sliding_window_view(loss, width), axis=1)
    if not np.isfinite(levels).all():
        return None
    k = int(np.argmin(levels[:-1]))
    low, now = float(levels[k]), float(levels[-1])
    # a loss that reaches 0 or below (an ELBO, a critic's) has no scale to rise by
    if not (low > 0 and now >= LOSS_UP * low):
        return None
    return Turn(low, now, lo + k + width - 1)


def history(th: Thresholds) -> int:
    """Steps before a chunk that `findings` reads: `lookback` for the rate's recent rise,
    `GROWING` for weights grown from nothing (a rise's own history is read from the
    trace)."""
    return max(th.lookback, 1, GROWING) + 2


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    """The learning rate in a steady rise (`rise`) as an update moves a layer's weights by
    `OUTGROW` of their size or more and the loss has turned up (`LOSS_UP`) since the rise
    began: an error of each such layer at the update's step (signal "rise"), ranked with
    the loop's bugs (`rootcause`); or as an update moves a layer's by `LARGE` or more and
    the loss has turned up over a whole `window` at `PAST_BEST` times the rate it was best
    at: an error of the layer with the largest update. Judged on the layers the learning
    rate is read for (the primary optimizer's), at sampled updates and, every step, by the
    change of the weights' norm; not on weights growing from nothing (`updates.GROWING`).
    The condition ends where the rate stopped rising over `lookback` steps."""
    w = trace.col("param_norm", lo, stop).astype(np.float64)
    upd = trace.col("update_ratio", lo, stop).astype(np.float64)
    lr = trace.scalar("lr", lo, stop).astype(np.float64)
    # row t judges the update of step t-1 (`updates.findings`): its size and the loss of
    # the step after it
    after, before = lagged(w, 1), lagged(w, 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        size = np.fmax(lagged(upd, 1), np.where(before > 0, np.abs(after - before) / before,
                                                np.nan))
    judged = np.array([i.has_params and i.primary_lr for i in trace.layers], bool)
    judged[few(trace, "params")] = False
    size[:, ~judged] = np.nan
    size[growing(trace, lo, stop, th)] = np.nan  # grown from nothing: large by nature
    with np.errstate(invalid="ignore"):
        outgrown = np.isfinite(size) & (size >= OUTGROW)
        still = lagged(lr[:, None], max(th.lookback, 1))[:, 0]
        settled = np.isfinite(lr) & np.isfinite(still) & (lr <= still)
        # the update's learning rate rose over the `lookback` steps before it
        rising = lagged((lr > still)[:, None].astype(np.float64), 1)[:, 0] > 0
        large = np.isfinite(size) & (size >= LARGE) & rising[:, None]
    codes = np.where(settled[:, None] & judged[None, :], OK, HOLD).astype(np.int8)
    said: dict[int, tuple[Rise, Turn, float | None]] = {}
    for t in np.flatnonzero(large.any(axis=1)):
        step = lo + int(t) - 1  # the update's step
        grown = rise(trace, step, th.lookback)
        if grown is None:
            continue
        since = int(grown.steps[0])
        turn = _turned_up(trace, since, lo + int(t), LEVEL_STEPS) \
            if outgrown[t].any() else None
        if turn is not None:  # the updates outgrew the weights
            codes[t, outgrown[t]] = ERROR
            said[step] = (grown, turn, None)
            continue
        turn = _turned_up(trace, since, lo + int(t), th.window)
        if turn is None:
            continue
        past = lr_of(trace, step) / lr_of(trace, turn.low_step)
        if past >= PAST_BEST:  # the largest update, with the loss
            codes[t, int(np.nanargmax(size[t]))] = ERROR
            said[step] = (grown, turn, past)

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        if s not in said:  # (each sentence is asked at the scan that found it)
            return (f"{name}: the learning rate rose to {fmt(p)} without stopping, and its "
                    f"update of step {s} moved its weights by {v:.2g} of their size")
        grown, turn, past = said[s]
        if past is None:
            what = (f"the updates outgrew the weights: the update of step {s} moved them by "
                    f"{v:.2g} of their size, and the loss turned up ({fmt(turn.low)} -> "
                    f"{fmt(turn.now)})")
        else:
            what = (f"the loss turned up as it rose: its level over {th.window} steps is "
                    f"{turn.now / turn.low:.1f}x its best since the rise began "
                    f"({fmt(turn.low)} by step {turn.low_step} -> {fmt(turn.now)}), at a "
                    f"learning rate {past:.1f}x the one it was best at, and the update of "
                    f"step {s} moved the weights by {v:.2g} of their size")
        return (f"{name}: the learning rate rose {grown.factor:.0f}x without stopping "
                f"({grown.path}), and {what}: a warm-up that never ends, or one that rises "
                f"past the rate the model bears. Cap it (LambdaLR(opt, lambda s: min(1.0, "
                f"(s + 1) / warmup_steps)), or LinearLR followed by a constant schedule), "
                f"at a peak the model bears")

    lr_at = np.broadcast_to(lagged(lr[:, None], 1), size.shape)
    return [Finding("lr_change", "rise", codes, size, previous=lr_at, message=message,
                    step_offset=-1,
                    recovery=lambda n, s, v, p, sev: f"{n}: the learning rate stopped rising "
                                                     f"by step {s} ({fmt(p)})")]
