"""The run told in plain sentences: the first failure, then what followed.

Used by `print(run)`, the CLI, scripts and the error of `stop_on`; views that can do more
(the panel) group the same events themselves.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..detect.events import Event
    from .run import Run

MAX_LAYERS_LISTED = 4

SIGNAL_LABELS = {("weights_not_updated", "rounding"): " (half-precision updates round away)",
                 ("vanishing_gradient", "cut"): " (exactly 0: no part of the loss reaches it)",
                 ("exploding_update", "collapse"): " (weights fell in one update)",
                 ("exploding_update", "shrink"): " (weights shrinking)"}
"""What a group's line adds to its kind where one kind has several causes."""


def headline(run: Run) -> str:
    root = run.first_failure
    steps, layers = run.trace.n_steps, run.trace.n_layers
    where = f"{steps} step{'s' * (steps != 1)}, {layers} layer{'s' * (layers != 1)}"
    who = "neuraldbg" if run.rank is None else f"neuraldbg [rank {run.rank[0]} of {run.rank[1]}]"
    if root is None and run.unstepped:
        return f"{who}: {run.unstepped} (see the note)."
    if root is None:
        warnings = sum(e.severity == "warning" for e in run.events)
        extra = f" ({warnings} warning{'s' * (warnings != 1)})" if warnings else ""
        return f"{who}: no failure found in {where}{extra}."
    n = len(run.symptoms)
    tail = {0: "", 1: "; the event after it is a symptom"}.get(
        n, f"; the {n} events after it are symptoms")
    return f"{who}: first failure: {root.message}{tail}."


def group(events: list[Event]) -> list[str]:
    """One line per (kind, signal): how many layers, from which step."""
    groups: dict[tuple[str, str, str], list[Event]] = defaultdict(list)
    for e in events:
        groups[(e.kind, e.signal, e.severity)].append(e)
    lines = []
    for (kind, signal, severity), evs in sorted(groups.items(), key=lambda g: g[1][0].step):
        layers = [e.layer for e in evs if e.layer]
        first = min(e.step for e in evs)
        label = kind.replace("_", " ") + (f" ({signal})" if kind == "regime_shift" else
                                          SIGNAL_LABELS.get((kind, signal), ""))
        if layers:
            names = ", ".join(dict.fromkeys(layers[:MAX_LAYERS_LISTED]))
            more = len(set(layers)) - len(set(layers[:MAX_LAYERS_LISTED]))
            names += f" and {more} more" if more > 0 else ""
            n = len(set(layers))
            lines.append(f"{severity}: {label} in {n} layer{'s' * (n != 1)} from step "
                         f"{first} ({names})")
        else:
            when = (f"at step {first}" if len(evs) == 1
                    else f"at {len(evs)} steps from step {first}")
            lines.append(f"{severity}: {label} {when}: {evs[0].message}")
    return lines


def _where(e: Event) -> str:
    """What an event is about: its layer, or for events of no layer, what they judge."""
    if e.layer is not None:
        return f"layer {e.layer}"
    if e.kind.startswith("loss_"):
        return "the loss"
    return "the input batch" if e.kind == "data_anomaly" else "the training loop"


GRADIENT_KINDS = frozenset({"vanishing_gradient", "exploding_gradient", "nonfinite_gradient",
                            "exploding_update"})


def _from_gradients(e: Event) -> bool:
    """Does the event judge what the backward gave (gradients, or the update made of
    them), rather than this process's own input, forward or loss?"""
    return e.kind in GRADIENT_KINDS or (e.kind == "regime_shift" and e.signal == "gradient")


def _lr_moved(events: list[Event], root: Event, lookback: int) -> list[str]:
    """The learning rate's moves (`lr_change`, info) in the `lookback` steps up to the
    first failure: a likely cause, said next to it. Units that died after a learning rate
    raised 10x at step 100 were the first failure at step 110, and nothing said why."""
    moves = [e for e in events
             if e.kind == "lr_change" and root.step - lookback <= e.step <= root.step]
    return [f"the learning rate went {e.previous:.3g} -> {e.value:.3g} at step {e.step}"
            + (", the same step" if e.step == root.step else
               f", {root.step - e.step} step{'s' * (root.step - e.step != 1)} before")
            + ": a likely cause" for e in moves]


def _edited(events: list[Event], root: Event, max_update: float) -> list[str]:
    """Weights of the first failure's layer changed outside the optimizer just before it
    (an `exploding_update` whose own update was small: `updates.findings`): the likely
    cause, said next to it. A transformer's query weights scaled 30x at step 150 were
    the first failure there (its activations jumped), while the edit itself was listed
    among the symptoms. Weights that lost most of their size in one update (signal
    "collapse": zeroed or reset in place) are said so too."""
    near = [e for e in events if e.kind == "exploding_update" and e.layer == root.layer
            and e.layer is not None and root.step - 1 <= e.step <= root.step
            and e is not root]
    lines = [f"its weights were changed outside the optimizer ({e.value:.3g}x their size) "
             f"during step {e.step}: a likely cause" for e in near
             if e.signal == "update" and e.previous < max_update <= e.value]
    lines += [f"its weights lost {1 - e.value / e.previous:.0%} of their size in one update, "
              f"during step {e.step} ({e.previous:.3g} -> {e.value:.3g}), as if zeroed or "
              f"reset outside the optimizer: a likely cause" for e in near
              if e.signal == "collapse" and e.previous > 0]
    return lines


def tell(run: Run) -> str:
    lines = [headline(run)]
    root = run.first_failure
    if root is not None:
        lines.append(f"  cause: [{root.kind}] step {root.step}, {_where(root)}")
        lines += [f"  {line}" for line in _lr_moved(run.events, root, run.thresholds.lookback)]
        lines += [f"  {line}" for line in _edited(run.events, root, run.thresholds.max_update)]
        if run.rank is not None and _from_gradients(root):
            lines.append("  (a distributed run averages the gradients over the ranks: where "
                         "this rank's input and activations were healthy, the failure may "
                         "have started in another rank's batch or forward; see its report)")
        symptoms = run.symptoms
        if symptoms:
            lines.append("  what followed:")
            lines += [f"    {line}" for line in group(symptoms)]
    others = [e for e in run.events if e.severity != "info"
              and (root is None or (e.step < root.step))]
    if others:
        lines.append("  before it:" if root is not None else "  events:")
        lines += [f"    {line}" for line in group(others)]
    if run.status not in ("finished", "training"):
        lines.append(f"  training {run.status_text}.")
    lines += [f"  note: {note}" for note in run.notes]
    cost = run.overhead
    if cost is not None:
        lines.append(f"  {cost}.")
    return "\n".join(lines)
