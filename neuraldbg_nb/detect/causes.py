"""Likely causes: what changed from outside the model's own computation next to the first
failure.

The first failure says where and when training went wrong (`rootcause`); a likely cause
says what probably made it go wrong there, from events that the root-cause order does not
blame, since they are someone's deliberate change rather than a failure:

- the learning rate moved (`lr_change`, an info) in the `lookback` steps up to the first
  failure: units that die after a learning rate raised 10x die some steps after the change,
  and the failure alone does not say why;
- the weights of the first failure's layer were changed outside the optimizer in the step
  before it or at it (an `exploding_update` whose own update, measured at a sampled step,
  was below `max_update`: `updates.findings`): weights scaled in place make the layer's
  activations jump, and the jump is the first failure while the edit is only a symptom;
- those weights lost most of their size in one update (signal "collapse"): zeroed or reset
  in place, which no optimizer's update does;
- an update that exploded applied the same step's exploding gradient at a learning rate
  that did not move: the gradient is what failed ("gradient");
- early in the run, the first step's gradients grow by a steady factor per layer toward
  the input (`growth`): the initialisation amplifies the backward signal ("init");
- the learning rate rose steadily, `warmup.RISE` times or more, and was still rising as
  the failure began (a warm-up that never stops, `warmup.rise`): no single move is large
  enough to be an "lr_change", yet the updates outgrow what the model bears ("lr_rise");
  where the updates were seen to outgrow the weights first, that is the failure itself
  (`warmup.findings`);
- a step schedule stepped per batch had cut the learning rate before the failure
  (`lr_change` with signal "per_batch", a warning at any step up to it): a model that stops
  learning, or a loss held at chance, is what the small rate leaves ("per_batch").

Pure functions of the events, the thresholds and the trace's first step, so a live run, a
re-classified one and a saved and loaded one give the same causes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..trace.columns import Trace
from .events import Event
from .growth import growth
from .thresholds import Thresholds
from .warmup import rise

_GRADIENT = ("exploding_gradient", "nonfinite_gradient")
_NOT_LR = ("data_anomaly", "lr_change", "eval_mode", "grads_not_zeroed", "no_gradients",
           "step_repeated", "not_in_optimizer", "cut_off", "loss_misuse")
"""Kinds of a first failure that a learning rate does not cause: the data, the learning
rate's own moves, the loop's bugs."""


@dataclass(frozen=True)
class Cause:
    """One likely cause of the first failure, with the numbers its sentence gives."""

    kind: str
    """"lr_change" (the learning rate moved), "edited" (weights changed outside the
    optimizer), "reset" (weights lost most of their size in one update), "gradient" (the
    update applied an exploding gradient), "init" (gradients grow per layer toward the
    input from the first step), "lr_rise" (the learning rate rose steadily into the
    failure; `step`: where the rise starts) or "per_batch" (a step schedule stepped per
    batch cut it; `step`: where that was first seen)."""
    step: int
    """The step it happened during."""
    layer: str | None
    """The layer whose weights changed; None for a learning rate."""
    value: float
    """The learning rate after the move or the rise, the weights' change (a factor of their
    size) or norm after the update, the gradient's norm, or the per-layer growth factor."""
    previous: float
    """The learning rate before the move, the optimizer's own update (a factor of the
    weights' size), the weights' norm before the update, the learning rate the gradient
    was applied at, the first layer's gradient norm, or the learning rate the rise started
    from."""
    text: str
    """The sentence the story, the panel and the CLI say next to the first failure."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return self.text


def likely_causes(events: list[Event], root: Event | None, th: Thresholds,
                  trace: Trace | None = None) -> list[Cause]:
    """The likely causes of the first failure `root` among `events`, learning rates first;
    none for a healthy run (`root` None). `trace`: the run's, for the causes read from
    its numbers ("gradient", "init")."""
    if root is None:
        return []
    moved = _lr_moved(events, root, th.lookback) + _per_batch(events, root)
    edited = _edited(events, root, th.max_update)
    if trace is not None and not edited:
        edited = _edited_before(root, trace, th.max_update)
    out = [*moved, *edited]
    if trace is not None and not moved:
        out += _gradient(events, root, trace, th)
        if not edited:
            out += _lr_rising(root, trace, th.lookback)
    return out


def _edited_before(root: Event, trace: Trace, max_update: float) -> list[Cause]:
    """The first failure's layer had its weights moved `max_update` or more of their size
    outside the optimizer before its step's forward (`w_edited`, read as the step's update
    began): the same cause as `_edited`'s, known at the step itself, where a run stopped
    at its first failure (`stop_on`) never sees the update that would carry it. Not where
    the first failure says it already: an update whose optimizer's own part was measured
    small (`updates.findings`: "changed outside the optimizer"), whose size, over the
    whole weights, would be given twice and another way."""
    if root.layer is None or root.signal == "edited" or root.layer not in trace.layer_names \
            or not trace.full_from <= root.step < trace.n_steps:
        return []
    if root.kind == "exploding_update" and root.signal == "update" \
            and root.previous < max_update:
        return []
    v = float(trace.col("w_edited", root.step, root.step + 1)[0,
                                                             trace.layer_index(root.layer)])
    if not v >= max_update:
        return []
    return [Cause("edited", root.step, root.layer, v, float("nan"),
                  f"its weights were changed outside the optimizer ({_size(v)}) before the "
                  f"forward of step {root.step}: a likely cause")]


def _size(moved: float) -> str:
    """An edit's move as a multiple of the weights' size (`w_edited`, an update's ratio),
    in words: an infinite one is a move off all-zero weights or to non-finite values."""
    return f"{moved:.3g}x their size" if math.isfinite(moved) else \
        "off all-zero weights or to non-finite values"


def _lr_rising(root: Event, trace: Trace, lookback: int) -> list[Cause]:
    """The learning rate in a steady rise up to the first failure (`warmup.rise`): a
    warm-up that never ends, named with its path, where the failure is not one a
    learning rate does not cause (the rise's own event among them)."""
    grown = None if root.kind in _NOT_LR else rise(trace, root.step, lookback)
    if grown is None:
        return []
    return [Cause("lr_rise", int(grown.steps[0]), None, float(grown.lr[-1]),
                  float(grown.lr[0]),
                  f"the learning rate rose {grown.factor:.0f}x without stopping "
                  f"({grown.path}), and was still rising as the failure began: a warm-up "
                  f"that never ends is a likely cause; cap it (LambdaLR(opt, lambda s: "
                  f"min(1.0, (s + 1) / warmup_steps)), or LinearLR followed by a constant "
                  f"schedule)")]


def _gradient(events: list[Event], root: Event, trace: Trace, th: Thresholds) -> list[Cause]:
    """An exploding update that applied its layer's gradient at the same step, at a
    learning rate that did not move (that gradient exploded, is the largest of the run's
    first step, or grew with the initialisation), and, for a failure of the gradients or
    such an update within `window` steps of the start, the first step's gradients growing
    per layer toward the input (`growth`)."""
    update = root.kind == "exploding_update" and root.signal == "update"
    grown = growth(trace) if (update or root.kind in _GRADIENT) and root.step <= th.window \
        else None
    exploded = any(e.kind == "exploding_gradient" and e.layer == root.layer
                   and e.step == root.step for e in events)
    out = []
    if update and (exploded or grown is not None) \
            and trace.full_from <= root.step < trace.n_steps:
        g = float(trace.col("grad_norm", root.step, root.step + 1)[0, trace.layer_index(
            root.layer or "")])
        lr = float(trace.scalar("lr", root.step, root.step + 1)[0])
        out.append(Cause("gradient", root.step, root.layer, g, lr,
                         f"the update applied its gradient of norm {g:.3g} at step "
                         f"{root.step}, at a learning rate that did not move ({lr:.3g}): "
                         f"the gradient exploded, the update only carried it into the "
                         f"weights"))
    if grown is not None:
        out.append(Cause("init", 0, None, grown.factor, grown.first_norm,
                         f"gradients grow about {grown.factor:.1f}x per layer toward the "
                         f"input from step 0 ({grown.last_norm:.3g} at {grown.last} -> "
                         f"{grown.first_norm:.3g} at {grown.first}): initialisation; use a "
                         f"smaller init (nn.init.xavier_uniform_, or kaiming_normal_ with "
                         f"the nonlinearity's gain) or normalisation layers (LayerNorm, "
                         f"BatchNorm) between the layers"))
    return out


def _lr_moved(events: list[Event], root: Event, lookback: int) -> list[Cause]:
    """The learning rate's moves in the `lookback` steps up to the first failure."""
    out = []
    for e in events:
        if e.kind != "lr_change" or e.signal != "lr" \
                or not root.step - lookback <= e.step <= root.step:
            continue
        gap = root.step - e.step
        when = ", the same step" if gap == 0 else f", {gap} step{'s' * (gap != 1)} before"
        text = (f"the learning rate went {e.previous:.3g} -> {e.value:.3g} at step {e.step}"
                f"{when}: a likely cause")
        out.append(Cause("lr_change", e.step, None, e.value, e.previous, text))
    return out


def _per_batch(events: list[Event], root: Event) -> list[Cause]:
    """The first warning, up to the first failure, that a step schedule is stepped per
    batch; none where the failure is one a learning rate does not cause."""
    if root.kind in _NOT_LR:
        return []
    for e in events:
        if e.kind == "lr_change" and e.signal == "per_batch" and e.step <= root.step:
            text = (f"the learning rate fell to {e.value:.3g} in drops a few steps apart by "
                    f"step {e.step}, as a step schedule stepped per batch instead of per "
                    f"epoch does: a likely cause")
            return [Cause("per_batch", e.step, None, e.value, e.previous, text)]
    return []


def _edited(events: list[Event], root: Event, max_update: float) -> list[Cause]:
    """Weights of the first failure's layer changed outside the optimizer, or reset, in
    the step before it or at it."""
    near = [e for e in events if e.kind == "exploding_update" and e.layer == root.layer
            and e.layer is not None and root.step - 1 <= e.step <= root.step
            and e is not root]
    out = [Cause("edited", e.step, e.layer, e.value, e.previous,
                 f"its weights were changed outside the optimizer ({_size(e.value)}) "
                 f"during step {e.step}: a likely cause")
           for e in near if e.signal == "update" and e.previous < max_update <= e.value]
    out += [Cause("reset", e.step, e.layer, e.value, e.previous,
                  f"its weights lost {1 - e.value / e.previous:.0%} of their size in one "
                  f"update, during step {e.step} ({e.previous:.3g} -> {e.value:.3g}), as if "
                  f"zeroed or reset outside the optimizer: a likely cause")
            for e in near if e.signal == "collapse" and e.previous > 0]
    return out
