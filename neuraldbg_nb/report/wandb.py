"""A run's events in Weights & Biases: a table of every event, the first failure in the run's
summary, and on request each layer's gradient norm per step. Events, not histograms: writing
them costs the training nothing."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .run import Run

COLUMNS: list[str | int] = ["step", "severity", "kind", "layer", "first_failure", "message"]


def to_wandb(run: Run, wandb_run: Any = None, grad_norms: bool = False) -> None:
    """Log `run` into `wandb_run` (default: the current `wandb.run`, which `wandb.init`
    made). The table is `neuraldbg/events`; the summary gets `neuraldbg/first_failure`,
    `neuraldbg/first_failure_step`, `neuraldbg/errors` and `neuraldbg/warnings`."""
    try:
        import wandb
    except ImportError as missing:
        raise ImportError("run.to_wandb() needs wandb: pip install wandb") from missing
    target = wandb_run if wandb_run is not None else wandb.run
    if target is None:
        raise RuntimeError("run.to_wandb(): no W&B run; call wandb.init(...) first or pass "
                           "the run")
    root = run.first_failure
    rows = [[e.step, e.severity, e.kind, e.layer or "", e is root, e.message]
            for e in run.events]
    target.log({"neuraldbg/events": wandb.Table(columns=COLUMNS, data=rows)})
    target.summary["neuraldbg/errors"] = sum(e.severity == "error" for e in run.events)
    target.summary["neuraldbg/warnings"] = sum(e.severity == "warning" for e in run.events)
    if root is not None:
        target.summary["neuraldbg/first_failure"] = root.message
        target.summary["neuraldbg/first_failure_step"] = root.step
    if grad_norms:
        steps, norms = run.trace.history("grad_norm")
        names = run.trace.layer_names
        # plotted against the watch's steps, whatever the W&B run's own step counter is
        target.define_metric("neuraldbg/step")
        target.define_metric("neuraldbg/grad_norm/*", step_metric="neuraldbg/step")
        for i, step in enumerate(steps.tolist()):
            values = {f"neuraldbg/grad_norm/{name}": v
                      for name, v in zip(names, norms[i].tolist()) if not math.isnan(v)}
            if values:
                target.log({**values, "neuraldbg/step": step})
