"""Root cause, not the loudest symptom: which event is the first failure.

At the step where things first went wrong, blame in this order (docs/diagnosis.md, "how
it finds the cause"): the data, and gradients the loop never zeroed or cleared before the
step, or that no optimizer holds or no loss reaches, and a learning rate still rising
past what the model bears (`warmup`): what the step computes from; then the first layer
in forward order whose activations went non-finite, jumped, or died; then the loss; then
the optimizer's update; and only then the gradients (exploding: the layer with the largest
gradient norm; vanishing: the deepest saturated layer, where the
backward signal first collapses, else the deepest vanishing layer; non-finite: the
deepest layer, where backward starts; a GradScaler's scale that collapsed as it skipped
every step tells those non-finite gradients' story, and comes first). The loss comes before the update because a step
computes it first: a loss that is infinite at a step makes that step's update
non-finite, and an update's effect on the loss shows only at the next step. A non-finite
update of a layer whose gradient was non-finite at that step only carried the gradient
into the weights: it counts as the gradient (`_ranker`), and so does an update that
explodes with its layer's gradient at the same step, at a learning rate that did not move. Weights that lost most of their
size in one update (signal "collapse": zeroed or reset in place, which no optimizer's
update does), and weights found changed outside the optimizer as the step's update began
(signal "edited"), changed before the step's forward: they count as that layer's own
change, in forward order with the activations (at one layer, an event of its activations
comes before the edit that made it, which `causes` names as its likely cause).

What probably made the first failure happen there (a learning rate moved, weights
changed outside the optimizer) is said by `causes.likely_causes`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .events import Event
from .thresholds import Thresholds

_STARTERS = {"regime_shift", "data_anomaly", "exploding_update"}
"""Warnings that may start a chain an error ends (a gradient jump never starts one)."""
_ACTIVATION = {"nonfinite_activation", "dead_units", "regime_shift"}


def _rank(e: Event) -> int:
    if e.kind in ("data_anomaly", "grads_not_zeroed", "no_gradients", "step_repeated",
                  "not_in_optimizer", "cut_off", "loss_misuse", "lr_change"):
        return 0
    if (e.kind in _ACTIVATION and e.signal == "activation") or e.signal in ("collapse",
                                                                              "edited"):
        return 1
    if e.kind.startswith("loss_"):
        return 2
    if e.kind == "exploding_update":
        return 3
    return 4


def _ranker(at: list[Event], events: list[Event] | None = None,
            lookback: int = 0) -> Callable[[Event], int]:
    """`_rank`, except that a non-finite update of a layer whose gradient was non-finite
    at the same step ranks with the gradients: the update only carried the gradient into
    the weights. A sqrt whose backward meets 0 makes NaN gradients, and the update
    carries them into the weights: blamed on the update, the first failure would read
    "weights became non-finite during step 153 (learning rate 0.001)", as if the learning
    rate were to blame."""
    carried = {e.layer for e in at if e.kind == "nonfinite_gradient"}
    # an update that explodes with the same step's exploding gradient, at a learning rate
    # that did not move (no `lr_change` within `lookback` steps), only applied that
    # gradient: the gradient is the failure
    step = at[0].step if at else -1
    moved = any(e.kind == "lr_change" and step - lookback <= e.step <= step
                for e in events or [])
    exploded = set() if moved else {e.layer for e in at if e.kind == "exploding_gradient"}

    def rank(e: Event) -> int:
        if e.kind == "exploding_update" and e.layer in carried and not math.isfinite(e.value):
            return 4
        if e.kind == "exploding_update" and e.signal == "update" and e.layer in exploded:
            return 4
        return _rank(e)
    return rank


def _escalated(events: list[Event], errors: list[Event]) -> dict[int, Event]:
    """The warnings that an error went on from, by id: the same condition of the same
    layer, open until the step the error began (a layer whose dead units cross the
    warning line at step 110 and the error line at step 250). The failure began with the
    warning: dated by the error, units that start dying after a learning rate raised 10x
    at step 100 would be a first failure at step 250, 140 steps after they began."""
    grew = {(e.kind, e.signal, e.layer, e.step) for e in errors}
    return {id(w): w for w in events if w.severity == "warning" and w.end is not None
            and (w.kind, w.signal, w.layer, w.end) in grew}


_STANDING = ("input_drift", "input_raw")
"""Input conditions that stand behind every step they stay open for (`_drifting`)."""


def _drifting(events: list[Event], first: int) -> dict[int, Event]:
    """Input drifts, and raw inputs, still open as the first failure begins, by id: the
    data moved 100x and more, slowly, and go on moving into the failure (inputs growing
    1.06x a step: the drift is found at step 205, and without this a layer's gradient
    exploding at step 235 would be blamed); pixels fed as 0-255 from step 0 make the
    loss diverge whenever it does. The data comes first, and neither is a jump for the
    lookback to find."""
    return {id(e): e for e in events if e.kind == "data_anomaly" and e.signal in _STANDING
            and e.step < first and (e.end is None or e.end >= first)}


def first_failure(events: list[Event], th: Thresholds) -> Event | None:
    """The event that started the first failure, or None for a healthy run."""
    errors = [e for e in events if e.severity == "error"]
    if not errors:
        return None
    began = _escalated(events, errors)
    first = min(e.step for e in [*errors, *began.values()])
    began.update(_drifting(events, first))
    first = min([first, *(e.step for e in began.values())])
    chain = [e for e in events
             if first - th.lookback <= e.step <= first
             and (e.severity == "error" or id(e) in began
                  or (e.severity == "warning" and e.kind in _STARTERS
                      and e.signal != "gradient"))]
    root_step = min(e.step for e in chain)
    at = [e for e in chain if e.step == root_step]
    rank = _ranker(at, events, th.lookback)
    best = min(rank(e) for e in at)
    tied = [e for e in at if rank(e) == best]
    if best < 4:  # (at one layer, its activations' event before the edit that made it)
        return min(tied, key=lambda e: (e.order, e.signal == "edited", e.kind))
    kinds = {e.kind for e in tied}
    scale = [e for e in tied if e.signal == "loss_scale"]
    if scale:  # a GradScaler that skipped every step: the non-finite gradients' story
        return scale[0]
    if "nonfinite_gradient" in kinds:
        return max((e for e in tied if e.kind == "nonfinite_gradient"), key=lambda e: e.order)
    if "exploding_gradient" in kinds:
        return max((e for e in tied if e.kind == "exploding_gradient"), key=lambda e: e.value)
    if "vanishing_gradient" in kinds:
        saturated = [e for e in events if e.kind == "saturation" and e.step <= root_step
                     and (e.end is None or e.end > root_step)]
        if saturated:
            return max(saturated, key=lambda e: e.order)
        return max((e for e in tied if e.kind == "vanishing_gradient"), key=lambda e: e.order)
    return min(tied, key=lambda e: (e.order, e.kind))


def symptoms(events: list[Event], root: Event | None) -> list[Event]:
    """Warnings and errors at or after the root cause's step, other than the root."""
    if root is None:
        return []
    return [e for e in events if e is not root and e.step >= root.step
            and e.severity in ("warning", "error")]
