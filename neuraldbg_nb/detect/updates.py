"""Optimizer updates: a layer's weights change by a large fraction in one step.

This is where a bad learning rate shows first: the step's gradients can be ordinary, but
the update that follows moves the weights by more than they weigh. Read from the weight
norm after each update (every step) and the update's own size (sampled steps); the row
that sees it is the step after the update, hence `step_offset=-1`. Weights edited in place
between two updates (a bug, a bad checkpoint merge) show here too, in the step whose
forward first uses them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..trace.columns import WEIGHT_PROBE, Trace
from . import gradients
from .baseline import lagged, within
from .regime import few
from .scan import ERROR, HOLD, INFO, OK, WARNING, Finding, fmt, grade
from .thresholds import Thresholds

GROWING = 10
"""Updates after one that started from all-zero weights during which the layer's updates
are not judged by their size. A zero-initialised tensor (a classifier head, the last
BatchNorm weight of each residual block under torchvision's `zero_init_residual`, a LoRA
B matrix) grows from nothing: its second update is as large as its first, so the weights
double, and with momentum they triple, at any learning rate. After k updates of similar
size an update is about 1/k of the weights (2/k under a linear warm-up), below
`max_update` well before this. Weights that go non-finite are still an error at once."""


TINY = 1e-4
"""Weights whose root-mean-square element is below this grow from next to nothing, as
from zeros (`GROWING`): LayerScale's per-channel gains start at 1e-5 or 1e-6 (CaiT,
ConvNeXt, DINOv2), where an ordinary Adam step is 10-1000x their size (judged by size, a
transformer's LayerScale gains would be "changed by 5x their size during step 0", the
run's first failure).
Initialisations scaled by fan-in give an RMS of 1/sqrt(fan_in): 0.003 at a fan-in of
100,000. Judged on layers read whole (at most `WEIGHT_PROBE` elements of their own), in
the run's first `window` steps: weights that shrink to next to nothing later and jump
from there are judged as any others."""


LR_SIZED = 10.0
"""At the run's start (its first `window` steps), an update of `max_update` up to this
many times the weights is a warning, not an error, where it moved the elements by no more
than the learning rate (the RMS of the step at most `lr`): the optimizer took the step it
was told to, on weights small against it. Adam's first step moves every element by the
learning rate; prompt tuning trains a prompt initialised from word embeddings (RMS 0.02)
at a learning rate of 0.03, and its first update, 1.5x the prompt's size, would
otherwise be an error and the run's first failure. So is such an update after which the
loss fell `FIT_FALL` times or more: a layer small against its first gradients grows to
its scale. A regression head (33 weights of norm 0.59) that must reach its targets'
scale reads "changed by 1.06x during step 1" under SGD with momentum at 0.05 while the
loss falls 8.2 -> 3.3; a learning rate too high, or gradients grown from the
initialisation, leave the loss where it was or make it turn up, and their first such
update stays an error."""

FIT_FALL = 2.0
"""The fall of the loss after an update at the run's start that shows the update fitted
the model (`LR_SIZED`): more than a batch's noise, which moves a loss of 1.4 by a few
percent."""


def _lr_sized(trace: Trace, step_rms: np.ndarray, lr: np.ndarray) -> np.ndarray:
    """Where an update's RMS element is at most the learning rate (with 10% slack for
    weight decay), on layers the primary optimizer trains."""
    primary = np.array([i.primary_lr for i in trace.layers], bool)[None, :]
    with np.errstate(invalid="ignore"):
        return primary & (step_rms <= 1.1 * lr[:, None])


def _tiny(trace: Trace, norms: np.ndarray) -> np.ndarray:
    """Where a layer's weights, read whole, have an RMS element below `TINY`."""
    n = np.array([i.params if 0 < i.params <= WEIGHT_PROBE else 0 for i in trace.layers],
                 np.float64)
    with np.errstate(invalid="ignore"):
        return (n > 0)[None, :] & (norms < TINY * np.sqrt(n)[None, :])


def _growing(born: np.ndarray, history: int) -> np.ndarray:
    """Rows within `GROWING` of a row that judges an update from all-zero weights (`born`),
    per column; within `history` at most, the rows the detector reads before its chunk
    (`window` + 2), so that a live scan in chunks sees the same rows as a scan in one go."""
    rows = np.arange(len(born))[:, None]
    last = np.maximum.accumulate(np.where(born, rows, -1), axis=0)
    return (last >= 0) & (rows - last < min(GROWING, history))


def _born(trace: Trace, after: np.ndarray, before: np.ndarray, ratio: np.ndarray, lo: int,
          th: Thresholds) -> np.ndarray:
    """Rows judging an update from weights that were all zeros, or next to nothing at the
    run's start (`TINY`), before it (`GROWING`): measured so at a sampled step (an
    infinite `ratio`), or read so from the norms of every step (a warm-up whose first
    learning rate is 0, or a layer behind another zero-initialised one, first moves at a
    step not sampled). `after`, `before`, `ratio`: as `findings` reads them."""
    born = np.isposinf(ratio)
    with np.errstate(invalid="ignore", divide="ignore"):
        # no norm is read before the run's first update: at most after / (ratio - 1)
        start = np.where(np.isnan(before) & (ratio > 1) & ~born, after / (ratio - 1), before)
        early = (np.arange(len(ratio)) + lo < th.window)[:, None]
        return born | ((before == 0) | (early & _tiny(trace, start))) & ~(after <= before) \
            & np.isfinite(after)


def growing(trace: Trace, lo: int, stop: int, th: Thresholds) -> np.ndarray:
    """Rows (each judging the update of the step before) at which a layer grows from
    nothing (`GROWING`), per layer: its updates there are not judged by their size."""
    w = trace.col("param_norm", lo, stop).astype(np.float64)
    upd = trace.col("update_ratio", lo, stop).astype(np.float64)
    born = _born(trace, lagged(w, 1), lagged(w, 2), lagged(upd, 1), lo, th)
    return _growing(born, th.window + 2) if born.any() else np.zeros_like(born)


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    """Updates that move a layer's weights by `max_update` or more of their norm, or make
    them non-finite. Not judged by size: the updates right after all-zero weights
    (`GROWING`), and layers whose own parameters are fewer than `regime.FEW` numbers,
    whose norm falls to nothing and back as a number crosses zero (a normalising flow's
    2-number scale can read "changed by 6.31x" under Adam's ordinary 7e-4 steps)."""
    w = trace.col("param_norm", lo, stop).astype(np.float64)
    upd = trace.col("update_ratio", lo, stop).astype(np.float64)
    lr = trace.scalar("lr", lo, stop)
    n = w.shape[0]
    # row t judges the update of step t-1: norm after it (w[t-1]) vs norm before (w[t-2])
    after, before, ratio = lagged(w, 1), lagged(w, 2), lagged(upd, 1)
    born = _born(trace, after, before, ratio, lo, th)
    ratio[np.isposinf(ratio)] = np.nan
    early = (np.arange(n) + lo < th.window)[:, None]  # at the run's start (`TINY`)
    with np.errstate(divide="ignore", invalid="ignore"):
        change = np.where(before > 1e-12, np.abs(after - before) / before, np.nan)
    change = np.fmax(change, ratio)
    blown = ~np.isfinite(after) & ~np.isnan(after)
    judged = ~np.isnan(change)
    if born.any():  # rare: one pass over the rows where it is needed
        judged &= ~_growing(born, th.window + 2)
    judged[:, few(trace, "params")] = False
    judged |= blown
    lr_at, lr_prev = lagged(lr, 1), lagged(lr, 2)  # learning rate of the update judged at row t
    size = np.array([max(i.params, 0) for i in trace.layers], np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        # before the run's first update no norm is read: at least after / (1 + ratio)
        step_rms = change * np.where(np.isnan(before), after / (1 + ratio), before) \
            / np.sqrt(size)[None, :]
    lr_sized = _lr_sized(trace, step_rms, lr_at)
    loss = trace.scalar("loss", lo, stop)
    with np.errstate(invalid="ignore"):
        # (`LR_SIZED`: the loss halved after the update)
        fitting = (FIT_FALL * loss < lagged(loss[:, None], 1)[:, 0])[:, None]
    mild = early & ~blown & (change < LR_SIZED * th.max_update) & (lr_sized | fitting)
    codes = grade(judged, (blown | (change >= th.max_update), ERROR))
    codes[mild & (codes == ERROR)] = WARNING
    first = lo
    # the step's lr is the primary optimizer's: not said of layers another one trains
    other_lr = {i.label for i in trace.layers if not i.primary_lr}
    labels = {i.label: j for j, i in enumerate(trace.layers)}

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        text = (f"{name}: weights changed by {v:.3g}x their size during step {s}"
                if np.isfinite(v) else f"{name}: weights became non-finite during step {s}")
        row = s + 1 - first
        if sev == "warning" and 0 <= row < n and name in labels \
                and not lr_sized[row, labels[name]]:  # (`LR_SIZED`, the loss fell)
            return (f"{text}, and the loss fell after it ({fmt(loss[row - 1])} -> "
                    f"{fmt(loss[row])}): a layer small against its first gradients growing "
                    f"to its scale; a learning rate too high if the loss turns up")
        if sev == "warning" and 0 <= row < n:  # (`LR_SIZED`)
            return (f"{text}: each moved by about the learning rate ({fmt(lr_at[row])}), "
                    f"more than the weights' own size; fine for a small initialisation "
                    f"(a prompt, an embedding), a learning rate too high otherwise")
        if p < th.max_update:  # the optimizer's own update was measured, and was small
            return (f"{name}: weights changed by {v:.3g}x their size during step {s}, but the "
                    f"optimizer's update moved them only {p:.2g}x: they were changed "
                    f"outside the optimizer")
        if name in other_lr:
            return text
        if 0 <= row < n and _lr_moved(lr_prev[row], lr_at[row]):
            text += f"; the learning rate went {fmt(lr_prev[row])} -> {fmt(lr_at[row])}"
        elif 0 <= row < n and lr_at[row] == lr_at[row]:
            text += f" (learning rate {fmt(lr_at[row])})"
        return text

    fell = _collapsed(after, before, judged & ~blown & ~lr_sized, trace)
    # a fall in one update is not also a slow shrink over the updates around it
    gradual = judged & ~within(fell.codes >= WARNING, SHRINK_UPDATES)
    value = np.where(blown, np.inf, change)
    edits = _edited(trace, lo, stop, th)
    # the update of a step whose weights were found edited before its forward carries
    # that edit: the edit's event says it, at the step
    codes[lagged(edits.codes.astype(np.float64), 1) == ERROR] = OK
    # `previous` carries the optimizer's own update size where it was measured (sampled
    # steps), so the sentence can tell an optimizer blow-up from weights edited in place
    return [Finding("exploding_update", "update", codes, value, previous=ratio,
                    message=message, step_offset=-1),
            _shrinking(w, gradual, trace), fell, edits]


def _edited(trace: Trace, lo: int, stop: int, th: Thresholds) -> Finding:
    """Weights that moved `max_update` or more of their size between the last update and
    the step's forward (`w_edited`, read as the step's update begins), at a step whose
    activations were not measured for that layer (`activations=False`, a compiled
    forward): changed in place outside the optimizer, the layer's own change, ranked
    with the activations (`rootcause`), and said at its own step, before the update that
    would carry it (the run may stop there: `stop_on`). Also where the layer's
    activations were measured: an edit that moves them little (a bias set to -20: its
    outputs move 3x) can kill the ReLU after it, and where they jumped, their own event
    comes first at the layer (`rootcause`) with the edit as its likely cause."""
    moved = trace.col("w_edited", lo, stop).astype(np.float64)
    observed = ~np.isnan(moved)
    observed[:, few(trace, "params")] = False
    codes = grade(observed, (moved >= th.max_update, ERROR))

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        size = f"by {v:.3g}x their size" if np.isfinite(v) else "to non-finite values"
        return (f"{name}: weights changed {size} before the forward of step {s}, after "
                f"the last optimizer step: they were changed outside the optimizer (in "
                f"place: an assignment under torch.no_grad(), .data, load_state_dict or "
                f"an init call inside the loop)")

    return Finding("exploding_update", "edited", codes, moved, message=message)


COLLAPSE = 2.5
"""Weights whose norm fell this many times in one update are a warning, and from
`COLLAPSE_ERROR` an error (signal "collapse", ranked as the layer's own change by
`rootcause`): a layer's weights zeroed or reset in place between two steps. A difference
of norms can show a growth of any size (the rule above) but a fall of at most 1x the
weights' size, below `max_update`: a conv layer whose weights are zeroed (its bias kept)
reads 1.76 -> 0.616, which that rule does not name. An optimizer's update does not take
60% off a layer's weights: even a weight decay 500x too strong takes 6.17 to 3.09
(`_shrinking` finds it). Not judged where the update moved each element by no more than the learning
rate (`_lr_sized`): gains of LayerScale's size (1e-3) cross zero under Adam's steps."""
COLLAPSE_ERROR = 5.0
"""From this fall on, a collapse is an error: the weights lost 80% of their norm, so they
moved by at least 0.8 of their size, next to `max_update`'s line for an update."""


def _collapsed(after: np.ndarray, before: np.ndarray, judged: np.ndarray,
               trace: Trace) -> Finding:
    """Weights whose norm fell `COLLAPSE`-fold or more in one update (see there)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        fall = np.where(np.isfinite(after) & (after >= 0), before / after, np.nan)
    codes = grade(judged & ~np.isnan(fall), (fall >= COLLAPSE, WARNING),
                  (fall >= COLLAPSE_ERROR, ERROR))
    codes[:, few(trace, "params")] = HOLD

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        lost = 1 - v / p if p > 0 else 1.0
        return (f"{name}: weights lost {lost:.0%} of their size during step {s} "
                f"({fmt(p)} -> {fmt(v)}): zeroed or reset in place, outside the optimizer, "
                f"or an update that overshot")

    return Finding("exploding_update", "collapse", codes, after, previous=before,
                   message=message, step_offset=-1)


SHRINK = 10.0
"""Weights whose norm fell this many times over the last `SHRINK_UPDATES` updates, each
update below `max_update`, are a warning: a weight decay set 500x too strong halves a
layer's weights at every step (6.17 -> 3.09 -> 1.56 ...), an update ratio of 0.5, which
no other rule names. It ends once the fall over as many updates is under `SHRUNK_OK`."""
SHRINK_UPDATES = 10
SHRUNK_OK = 3.0


def _shrinking(w: np.ndarray, judged: np.ndarray, trace: Trace) -> Finding:
    """Weights shrinking `SHRINK`-fold within `SHRINK_UPDATES` updates (signal "shrink"),
    judged where the exploding-update rule is (`judged`)."""
    after, then = lagged(w, 1), lagged(w, 1 + SHRINK_UPDATES)
    with np.errstate(divide="ignore", invalid="ignore"):
        fall = np.where((after > 0) & np.isfinite(then), then / after, np.nan)
    codes = np.where(np.isnan(fall) | ~judged, HOLD, np.where(
        fall >= SHRINK, WARNING, np.where(fall < SHRUNK_OK, OK, HOLD))).astype(np.int8)
    codes[:, few(trace, "params")] = HOLD
    return Finding("exploding_update", "shrink", codes, after, previous=then,
                   step_offset=-1,
                   message=lambda n, s, v, p, sev: f"{n}: weights shrank {p / v:.0f}x in the "
                                                   f"last {SHRINK_UPDATES} updates, by step {s} "
                                                   f"({fmt(p)} -> {fmt(v)}): a weight decay "
                                                   f"far too strong, or updates that pull "
                                                   f"every weight to 0",
                   recovery=lambda n, s, v, p, sev: f"{n}: weights steady again ({fmt(v)}) "
                                                    f"at step {s}")


SPARSE_ROWS = frozenset({"Embedding", "EmbeddingBag"})
"""Layers whose update touches only the rows of the batch: the weight probe's slice (its
first rows) may rightly not move for many steps."""


def stall_findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    """Weights that the optimizer's updates leave exactly as they were although they have
    gradients: a layer left out of the optimizer (it was made from some of the model's
    parameters, or before the layer was replaced), or a learning rate of 0. Nothing
    breaks, the loss still falls through the other layers.

    Judged at sampled steps (not at an exact fit at an ordinary learning rate, where they
    have nothing left to learn: `gradients.converged`): their update size is exactly 0
    only when not one weight of the slice read moved (a tiny learning rate still moves
    them), and the update of the step before left the weights' norm the very same
    number. Two updates in a row, so that the first one of a warm-up from a learning
    rate of 0 is not one. Left out:
    layers trained by another optimizer than the one that marks the steps (a GAN's
    generator may rightly sit out several of the critic's steps), embeddings
    (`SPARSE_ROWS`), and gradients left over from an earlier step (see `pushed`)."""
    w = trace.col("param_norm", lo, stop).astype(np.float64)
    upd = trace.col("update_ratio", lo, stop).astype(np.float64)
    g = trace.col("grad_norm", lo, stop).astype(np.float64)
    # row t judges the update of step t-1 (as above): its size, the gradient it was
    # given and the one before, and the weight norms around the update of step t-2
    ratio, grad, grad_before = lagged(upd, 1), lagged(g, 1), lagged(g, 2)
    unmoved = lagged(trace.col("update_unmoved", lo, stop).astype(np.float64), 1)
    w1, w2 = lagged(w, 2), lagged(w, 3)
    judged = np.array([i.has_params and i.primary_lr and i.type not in SPARSE_ROWS
                       for i in trace.layers], bool)[None, :]
    with np.errstate(invalid="ignore"):
        # a gradient left over from an earlier step (a model done training, a GAN's
        # generator sitting out a step, without zero_grad) reads the very same norm: it
        # pushes nothing this step
        pushed = np.isfinite(grad) & (grad > 0) & (grad != grad_before)
        # a half-precision layer is judged by how many of its weights stayed put (below)
        known = judged & pushed & ~np.isnan(ratio) & np.isnan(unmoved)
    # at an exact fit (`gradients.converged`: the loss far below where it was, or 0) at
    # an ordinary learning rate, the gradients left are next to nothing, and an update
    # of them rounds away in float32 (SGD at 0.02 on a gradient of 1e-7): nothing is left
    # to learn, not judged. A learning rate brought to about 0 is judged there too.
    far = max(trace.full_from, lo - gradients.history(th))  # the loss's own history
    converged = gradients.converged(trace, far, stop, th)[lo - far:, None]
    lr = lagged(trace.scalar("lr", lo, stop), 1)  # the learning rate of the update judged
    with np.errstate(invalid="ignore"):
        fitted = (lagged(converged.astype(np.float64), 1) > 0) & (lr >= TOO_SMALL)[:, None]
        known &= ~fitted
        still = known & (ratio == 0) & np.isfinite(w1) & (w1 == w2)
        # the same two updates in a row, each by less than `NEGLIGIBLE`
        negligible = known & (ratio < NEGLIGIBLE) & np.isfinite(w1) & \
            (np.abs(w1 - w2) <= NEGLIGIBLE * np.abs(w2))
    codes = grade(known, (still, WARNING))

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        text = (f"{name}: the optimizer's updates leave its weights unchanged from step {s}, "
                f"though their gradient norm is {fmt(v)}: ")
        rate = lr_of(trace, s)
        if rate < TOO_SMALL:  # (NaN is not)
            return text + f"the learning rate is {fmt(rate)}{_since(trace, s)}"
        if v < th.vanish:  # (the vanishing gradient's line)
            return text + ("so small a gradient makes updates far below what a float32 "
                           "weight can tell, and each rounds away: the gradient vanished "
                           "on its way back to this layer (saturated activations, a deep "
                           "stack without normalisation or skip connections)")
        return text + ("they are not in the optimizer, or their learning rate is 0 (if "
                       "they are meant to stay as they are, requires_grad_(False) saves "
                       "computing their gradients)")

    rounded = _rounded(unmoved, judged & pushed, lr, lo, th)
    model = _whole_model(np.where(negligible, WARNING, codes).astype(np.int8), codes,
                         rounded.codes, judged & np.isfinite(grad),
                         np.isfinite(grad).sum(axis=1), lr, lo, trace)
    model = replace(model, began=_tiny_since(trace, per_layer=False))
    return [Finding("weights_not_updated", "update", codes, grad, message=message,
                    recovery=lambda n, s, v, p, sev: f"{n}: weights updated again at step {s}",
                    step_offset=-1, began=_tiny_since(trace, per_layer=True)),
            rounded, model]


def _tiny_since(trace: Trace, per_layer: bool) -> Callable[[int, int], int]:
    """`Finding.began` for updates that stopped moving the weights at a learning rate
    below `TOO_SMALL`: the update size is read on sampled steps, the learning rate on
    every step, so the stall began where the learning rate last fell below `TOO_SMALL`,
    and not before the update measured last before the one that showed it (that one
    was not yet two still updates in a row; it may have been the first). Read from the
    trace alone, so a live scan in chunks dates it as a scan in one go does."""
    def began(j: int, seen: int) -> int:
        lo = trace.full_from
        upd = trace.col("update_ratio", lo, seen)
        measured = ~np.isnan(upd[:, j] if per_layer else upd).reshape(len(upd), -1).any(1)
        before = np.flatnonzero(measured)
        floor = lo + int(before[-1]) if len(before) else lo
        lr = trace.scalar("lr", floor, seen + 1).astype(np.float64)
        if not len(lr) or not lr[-1] < TOO_SMALL:  # (NaN: no learning rate read)
            return seen
        with np.errstate(invalid="ignore"):
            above = np.flatnonzero(~(lr < TOO_SMALL))
        return floor + (int(above[-1]) + 1 if len(above) else 0)
    return began


def _whole_model(stalled: np.ndarray, stalled_exactly: np.ndarray, rounded: np.ndarray,
                 trained: np.ndarray, with_grad: np.ndarray, lr: np.ndarray, lo: int,
                 trace: Trace) -> Finding:
    """The whole model stopped learning: at a sampled update, every layer judged that had
    a gradient was left as it was (`stalled`: exactly, or by less than `NEGLIGIBLE` of its
    size, which counts only at a learning rate below `TOO_SMALL`; `rounded`: its
    half-precision updates round away), at least two of them or the only layer with a gradient
    (`with_grad`: layers not judged, such as another optimizer's, count there), for a
    reason that holds for the whole model: its half-precision updates round away, or the
    learning rate is below `TOO_SMALL`. (At an ordinary learning rate the layers are out of
    the optimizer, `not_in_optimizer`, or the optimizer trains the model's input.) An error,
    where
    one layer in many is a warning of its own: nothing the model does changes any more
    (a learning rate brought to about 0, a model cast whole to bfloat16 at a small
    learning rate). A row where some such layer was not judged holds the last verdict."""
    verdict = np.maximum(stalled, rounded)  # WARNING where either says stalled
    seen = verdict >= 0
    complete = (seen | ~trained).all(axis=1) & seen.any(axis=1)
    n = seen.sum(axis=1).astype(np.float64)
    all_still = ((verdict == WARNING) | ~seen).all(axis=1) & ((n >= 2) | (with_grad == 1))
    exact = ((np.maximum(stalled_exactly, rounded) == WARNING) | ~seen).all(axis=1)
    half: np.ndarray = np.asarray((rounded >= 0).any(axis=1))
    with np.errstate(invalid="ignore"):
        tiny = lr < TOO_SMALL
        # a reason that holds for every layer; moves below `NEGLIGIBLE` only at a
        # learning rate that small (elsewhere they are a converged model's)
        whole = half & exact | tiny
    codes = np.where(complete, np.where(all_still & whole, ERROR, OK), HOLD).astype(np.int8)
    codes = codes[:, None]

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        # the row of the verdict: the first judged from the step's (a stall dated from
        # where the learning rate fell is judged at the sample after it, `Finding.began`)
        judged = np.flatnonzero(complete[max(s + 1 - lo, 0):])
        row = max(s + 1 - lo, 0) + int(judged[0]) if len(judged) else -1
        rate = lr_of(trace, s)
        layers = f"{v:.0f} layer{'s' * (v != 1)}"
        if 0 <= row < len(half) and half[row]:
            why = (f"their half-precision updates round away at a learning rate of "
                   f"{fmt(rate)} (updates below about 1/256 of a weight in bfloat16). Keep "
                   f"the weights in float32 and run the forward under torch.autocast, or "
                   f"raise the learning rate")
        elif (since := _since(trace, s)) or trace.full_from > 0 or np.nanmax(
                trace.scalar("lr", 0, s + 1), initial=0.0) >= TOO_SMALL:
            why = (f"the learning rate is {fmt(rate)}{since}: a scheduler stepped per batch "
                   f"instead of per epoch, or a decay far too strong. Step the scheduler "
                   f"once per epoch, or raise the learning rate")
        else:  # about 0 at every step of the run
            why = (f"the learning rate is {fmt(rate)} from the start: the optimizer was "
                   f"given a learning rate of about 0 (a typo, a setting read as 0, a "
                   f"schedule that starts at 0 and never rises). Give it the learning rate "
                   f"the recipe means")
        how = "exactly as they were" if 0 <= row < len(exact) and exact[row] else \
            f"as they were (moved by less than {NEGLIGIBLE:g} of their size)"
        return (f"the whole model stopped learning from step {s}: the updates leave the "
                f"weights of all {layers} with gradients {how}; {why}")

    return Finding("weights_not_updated", "model", codes, n[:, None], message=message,
                   per_layer=False, step_offset=-1,
                   recovery=lambda n, s, v, p, sev: f"updates move the model's weights "
                                                    f"again at step {s}")


NEGLIGIBLE = 1e-7
"""An update that moves a weight slice by less than this share of its size (about float32's
precision) changes nothing a model computes: at a learning rate below `TOO_SMALL`, a layer
whose updates are this small counts as stalled for `_whole_model` (SGD's small weights
still move by 1e-10 of their size there, which no exact test sees)."""

TOO_SMALL = 1e-8
"""A learning rate below this moves no float32 weight of ordinary size (their precision is
about 1e-7 of a weight): a stall at such a rate is the rate's, and the sentence says so
instead of guessing at an optimizer that left the layer out. A StepLR stepped per batch
instead of per epoch takes 1e-3 to 2.5e-11 in 60 steps: "their learning rate is 0" would
be wrong."""


def lr_of(trace: Trace, step: int) -> float:
    """The learning rate of `step` (NaN where the trace no longer holds it exactly)."""
    if not trace.full_from <= step < trace.n_steps:
        return math.nan
    return float(trace.scalar("lr", step, step + 1)[0])


def _since(trace: Trace, step: int) -> str:
    """Where the learning rate of `step` took its value, from the steps the trace holds:
    " since step k (was x)" when it fell to it in one step from a level it held (set by
    hand, a schedule's one drop), ", down from x at step k" when it decayed to it from
    there (a per-batch schedule: its drops, and the steps between them), or nothing when
    it was so from the first step held. Read from the trace, not a scan's rows, so a live
    scan in chunks says what a scan in one go does."""
    lo = trace.full_from
    lr = trace.scalar("lr", lo, step + 1).astype(np.float64)
    row = step - lo
    before = np.flatnonzero(np.isfinite(lr[:row]) & (lr[:row] >= TOO_SMALL))
    if not len(before):
        return ""
    k = int(before[-1])
    j = k  # back over the fall that led to row k (its drops and the steps between them)
    while j > 0 and np.isfinite(lr[j - 1]) and lr[j - 1] >= lr[j]:
        j -= 1
    while j < k and lr[j + 1] == lr[j]:  # the fall begins where its first level ends
        j += 1
    if j == k:
        return f" since step {k + 1 + lo} (was {fmt(lr[k])})"
    return f", down from {fmt(lr[j])} at step {j + lo}"


def _rounded(unmoved: np.ndarray, judged: np.ndarray, lr: np.ndarray, lo: int,
             th: Thresholds) -> Finding:
    """Half-precision weights that the updates leave as they were: bfloat16 keeps 8
    significant bits, so an update below about 1/256 of a weight rounds away (float16:
    1/2048), and a layer whose updates mostly do stops learning while its gradients, its
    loss and every other number look ordinary. It shows at a small learning rate, late in
    training as Adam's steps shrink, and in a model cast to bfloat16 whole (`model.bfloat16()`)
    instead of trained under autocast, which keeps float32 weights.

    Judged at sampled steps (`update_unmoved`, of the weight probe's slice), where the
    layer has a fresh gradient and the update's learning rate is not 0 (a warm-up's first
    step). A warning from `th.unmoved` of its weights unchanged; it ends below 0.8 of
    that, and in between the last verdict holds, so a fraction hovering at the line
    gives one event. Healthy bfloat16 training leaves a third to three quarters of the
    weights unchanged late in a run; a stalled one, nine in ten and more."""
    with np.errstate(invalid="ignore"):
        seen = judged & ~np.isnan(unmoved) & ~(lr[:, None] <= 0)
        codes = grade(seen & ((unmoved >= th.unmoved) | (unmoved < 0.8 * th.unmoved)),
                      (unmoved >= th.unmoved, WARNING))

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        row = s + 1 - lo  # the row that judges the update of step s
        rate = lr[row] if 0 <= row < len(lr) else np.nan
        at = f" at a learning rate of {fmt(rate)}" if np.isfinite(rate) else ""
        return (f"{name}: the update of step {s} left {v:.0%} of its half-precision weights "
                f"exactly as they were{at}: updates below their precision (about 1/256 of a "
                f"weight in bfloat16) round away, so the layer has stopped learning. Keep "
                f"the weights in float32 and run the forward under torch.autocast, or raise "
                f"the learning rate")

    return Finding("weights_not_updated", "rounding", codes, unmoved, message=message,
                   recovery=lambda n, s, v, p, sev: (f"{n}: updates move its weights again "
                                                     f"at step {s} ({v:.0%} left unchanged)"),
                   step_offset=-1)


LR_SLACK = 0.01
"""Decades a learning rate's move may fall short of `jump` and still count (2.3%): StepLR's
gamma of 0.1 takes 0.05 to 0.005000000000000001, a factor of 10 that reads
0.9999999999999999 decades in floating point; a base learning rate raised 10x under a
cosine schedule that decays it in the same step moves 9.975x. Both must count, so that
the story can name them beside the failure they cause (`causes`)."""


def lr_findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    """An info event where the learning rate moves by `jump` or more in one step."""
    lr = trace.scalar("lr", lo, stop)
    prev = np.full_like(lr, np.nan)
    prev[1:] = lr[:-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.abs(np.log10(lr / prev))
    codes = np.where(np.isnan(factor), HOLD,
                     np.where(factor >= np.log10(th.jump) - LR_SLACK, INFO, OK)).astype(np.int8)
    return [Finding("lr_change", "lr", codes[:, None], lr[:, None], previous=prev[:, None],
                    per_layer=False,
                    message=lambda n, s, v, p, sev: f"learning rate changed {fmt(p)} -> "
                                                    f"{fmt(v)} at step {s}"),
            _stepped_per_batch(lr, prev, trace.scalar("in_epoch_start", lo, stop), lo, th)]


QUOTED_LR_MOVE = 2.0
"""A learning rate that moved by this factor or more (either way) at an update is quoted
beside it ("the learning rate went 0.001 -> 0.05"); a schedule's step-to-step drift
(0.0933 -> 0.0913) is not, where it would read as the update's cause."""


def _lr_moved(before: float, now: float) -> bool:
    if not (math.isfinite(before) and math.isfinite(now)) or before == now:
        return False  # (not recorded)
    if before <= 0 or now <= 0:  # to or from 0
        return True
    return max(now / before, before / now) >= QUOTED_LR_MOVE


PER_BATCH_HISTORY = 4
"""Windows of history a step schedule's drops are read over (`_stepped_per_batch`)."""


def per_batch_history(th: Thresholds) -> int:
    """Steps before a chunk that `lr_findings` reads."""
    return PER_BATCH_HISTORY * th.window + 2


def _drops(lr: np.ndarray, prev: np.ndarray, th: Thresholds) -> np.ndarray:
    """Rows where a step schedule dropped the learning rate: from a rate held for a step
    (a schedule's plateau) to a lower one above 0, or by `jump` at once from anywhere. A
    smooth decay (cosine, exponential, one-cycle) lowers it every step, never from a
    plateau."""
    before = np.full_like(prev, np.nan)
    before[1:] = prev[:-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        fall = np.log10(prev / lr)
    held = prev == before
    return (lr > 0) & (fall > 1e-6) & (held | (fall >= np.log10(th.jump) - LR_SLACK))


def _stepped_per_batch(lr: np.ndarray, prev: np.ndarray, epoch_start: np.ndarray, lo: int,
                       th: Thresholds) -> Finding:
    """A step schedule stepped every batch instead of every epoch: a chain of two drops
    or more (`_drops`), each fewer than `window` steps after the one before, the last within
    the last `window` steps, that has taken the learning rate `jump` times below where
    the chain began (within `LR_SLACK`), read over the last `per_batch_history` steps.
    StepLR(step_size=5, gamma=0.1) stepped per batch divides the rate 10x every 5 steps,
    StepLR(step_size=10, gamma=0.5) 16x in 40; a schedule stepped per epoch drops once an
    epoch, and a smooth one never from a plateau. Nor is a chain each of whose drops came
    at the first batch of an epoch (`epoch_start`, known where the batches come from a
    DataLoader): a schedule stepped once an epoch of few batches (ExponentialLR(0.5) over
    16 batches halves the rate every 16 steps). A warning while the chain goes on; the
    whole model stopped learning, once the rate has reached about 0, is the error
    (`_whole_model`)."""
    dropped = _drops(lr, prev, th)
    rows = np.flatnonzero(dropped)
    codes = np.where(np.isnan(lr), HOLD, OK).astype(np.int8)
    chains: dict[int, list[int]] = {}
    horizon = PER_BATCH_HISTORY * th.window
    floor = np.log10(th.jump) - LR_SLACK
    near = np.zeros(len(lr) + th.window, bool)  # rows a drop precedes by under `window`
    for d in rows:
        near[d:d + th.window] = True
    for r in np.flatnonzero(near[:len(lr)]):
        recent = rows[(rows <= r) & (rows > r - horizon)]
        if len(recent) < 2 or r - recent[-1] >= th.window or np.isnan(lr[r]):
            continue
        gaps = np.flatnonzero(np.diff(recent) >= th.window)
        chain = recent[gaps[-1] + 1:] if len(gaps) else recent
        with np.errstate(divide="ignore", invalid="ignore"):
            fell = np.log10(prev[chain[0]] / lr[r])
        if len(chain) >= 2 and fell >= floor and not (epoch_start[chain] == 1).all():
            codes[r] = WARNING
            chains[int(r)] = [int(c) for c in chain]

    def message(name: str, s: int, v: float, p: float, sev: str) -> str:
        row = s - lo
        chain = chains.get(row, [row])
        steps = [f"{fmt(prev[r])} -> {fmt(lr[r])} at step {r + lo}" for r in chain]
        path = ", ".join(steps if len(steps) <= 4 else [*steps[:2], "...", steps[-1]])
        return (f"the learning rate fell {fmt(prev[chain[0]] / lr[row])}x in {len(chain)} "
                f"drops within {chain[-1] - chain[0] + 1} steps ({path}): a step schedule "
                f"(StepLR, MultiStepLR) stepped every batch instead of every epoch? Call "
                f"scheduler.step() once per epoch")

    return Finding("lr_change", "per_batch", codes[:, None], lr[:, None],
                   previous=prev[:, None], per_layer=False, message=message)
