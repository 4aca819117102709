"""A run's events in TensorBoard: each event as text at its step, the first failure marked,
and on request each layer's gradient norm as a scalar per step.

Events, not histograms: writing them costs nothing to the training, and a reader finds the
first failure at its step beside the loss curves already logged there.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .run import Run

TAG = "neuraldbg"


def to_tensorboard(run: Run, writer: Any, grad_norms: bool = False) -> Path | None:
    """Write `run` to `writer`: a `torch.utils.tensorboard.SummaryWriter` (or any object with
    its `add_text` / `add_scalar`), or a log folder, for which a writer is made and closed.
    Tags: `neuraldbg/events` (one text per step with events), `neuraldbg/first_failure`,
    `neuraldbg/errors` and `neuraldbg/warnings` (running counts), and with `grad_norms`
    `neuraldbg/grad_norm/<layer>` for every recorded step. Returns the folder written to
    when one was given."""
    folder = None
    if isinstance(writer, (str, Path)):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as missing:
            raise ImportError("run.to_tensorboard(logdir) needs tensorboard: pip install "
                              "tensorboard (or pass a writer of your own)") from missing
        folder = Path(writer)
        writer = SummaryWriter(str(folder))
    root = run.first_failure
    by_step: dict[int, list[str]] = {}
    for e in run.events:
        mark = "**first failure** " if e is root else ""
        by_step.setdefault(e.step, []).append(f"- {mark}{e.severity}: {e.message}")
    errors = warnings = 0
    for step in sorted(by_step):
        writer.add_text(f"{TAG}/events", "\n".join(by_step[step]), step)
        here = [e for e in run.events if e.step == step]
        errors += sum(e.severity == "error" for e in here)
        warnings += sum(e.severity == "warning" for e in here)
        writer.add_scalar(f"{TAG}/errors", errors, step)
        writer.add_scalar(f"{TAG}/warnings", warnings, step)
    if root is not None:
        writer.add_text(f"{TAG}/first_failure", root.message, root.step)
    if grad_norms:
        steps, norms = run.trace.history("grad_norm")
        for j, name in enumerate(run.trace.layer_names):
            for step, value in zip(steps.tolist(), norms[:, j].tolist()):
                if not math.isnan(value):
                    writer.add_scalar(f"{TAG}/grad_norm/{name}", value, step)
    if folder is not None:
        writer.close()
    else:
        writer.flush()
    return folder
