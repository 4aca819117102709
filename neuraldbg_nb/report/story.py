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
                 ("exploding_update", "shrink"): " (weights shrinking)",
                 ("lr_change", "rise"): " (still rising: updates outgrew the weights)"}
"""What a group's line adds to its kind where one kind has several causes."""


def watched_nothing(run: Run) -> str | None:
    """Why a run that ended recorded no layer or no step, in a sentence (None: it did, or
    it is still training): the one home of these words (the headline, the panel's note)."""
    t = run.trace
    if run.status == "training" or (t.n_steps > 0 and t.n_layers > 0):
        return None
    if t.n_steps == 0 and run.status in ("raised", "interrupted", "exited"):
        return (f"nothing was watched: the code {run.status_text} before its first "
                "training step")
    if t.n_layers == 0 and t.n_steps > 0:
        steps = f"{t.n_steps} step{'s' * (t.n_steps != 1)}"
        return (f"nothing was watched: no layer of a model was found (watched no layer in "
                f"{steps}; the watch reads the nn.Module the code trains"
                + ("; see the notes)" if run.notes else ")"))
    return ("nothing was watched: the code ran no training step (no backward() and "
            "optimizer.step() of a torch model)")


def headline(run: Run) -> str:
    root = run.first_failure
    steps, layers = run.trace.n_steps, run.trace.n_layers
    where = f"{steps} step{'s' * (steps != 1)}, {layers} layer{'s' * (layers != 1)}"
    who = "neuraldbg" if run.rank is None else f"neuraldbg [rank {run.rank[0]} of {run.rank[1]}]"
    if root is None and run.unstepped:
        return f"{who}: {run.unstepped} (see the note)."
    nothing = watched_nothing(run) if root is None else None
    if nothing is not None:
        return f"{who}: {nothing}."
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


def tell(run: Run) -> str:
    """The whole story: the headline, the first failure with its likely causes
    (`run.likely_causes`), what followed, the events before it, how training ended, the
    notes and what watching cost."""
    lines = [headline(run)]
    root = run.first_failure
    if root is not None:
        lines.append(f"  cause: [{root.kind}] step {root.step}, {_where(root)}")
        lines += [f"  {cause}" for cause in run.likely_causes]
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
