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
  in place, which no optimizer's update does.

Pure functions of the events and the thresholds, so a live run, a re-classified one and a
saved and loaded one give the same causes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .events import Event
from .thresholds import Thresholds


@dataclass(frozen=True)
class Cause:
    """One likely cause of the first failure, with the numbers its sentence gives."""

    kind: str
    """"lr_change" (the learning rate moved), "edited" (weights changed outside the
    optimizer) or "reset" (weights lost most of their size in one update)."""
    step: int
    """The step it happened during."""
    layer: str | None
    """The layer whose weights changed; None for a learning rate."""
    value: float
    """The learning rate after the move, or the weights' change (a factor of their size)
    or norm after the update."""
    previous: float
    """The learning rate before the move, the optimizer's own update (a factor of the
    weights' size), or the weights' norm before the update."""
    text: str
    """The sentence the story, the panel and the CLI say next to the first failure."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return self.text


def likely_causes(events: list[Event], root: Event | None, th: Thresholds) -> list[Cause]:
    """The likely causes of the first failure `root` among `events`, learning rates first;
    none for a healthy run (`root` None)."""
    if root is None:
        return []
    return [*_lr_moved(events, root, th.lookback), *_edited(events, root, th.max_update)]


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


def _edited(events: list[Event], root: Event, max_update: float) -> list[Cause]:
    """Weights of the first failure's layer changed outside the optimizer, or reset, in
    the step before it or at it."""
    near = [e for e in events if e.kind == "exploding_update" and e.layer == root.layer
            and e.layer is not None and root.step - 1 <= e.step <= root.step
            and e is not root]
    out = [Cause("edited", e.step, e.layer, e.value, e.previous,
                 f"its weights were changed outside the optimizer ({e.value:.3g}x their "
                 f"size) during step {e.step}: a likely cause")
           for e in near if e.signal == "update" and e.previous < max_update <= e.value]
    out += [Cause("reset", e.step, e.layer, e.value, e.previous,
                  f"its weights lost {1 - e.value / e.previous:.0%} of their size in one "
                  f"update, during step {e.step} ({e.previous:.3g} -> {e.value:.3g}), as if "
                  f"zeroed or reset outside the optimizer: a likely cause")
            for e in near if e.signal == "collapse" and e.previous > 0]
    return out
