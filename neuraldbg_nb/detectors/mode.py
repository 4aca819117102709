"""Training in evaluation mode: a model left in `model.eval()` after an evaluation.

Nothing breaks, so no other detector sees it: the loss still falls. Dropout
is off and BatchNorm normalises with running statistics it no longer updates. A notebook
that evaluates in one cell and trains again in the next, without `model.train()`, does
exactly this. The probe counts the layers that act by mode as each backward starts;
this reads that count.
"""

from __future__ import annotations

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._scan import HOLD, OK, WARNING, Finding


def _message(name: str, step: int, v: float, previous: float, severity: str) -> str:
    layers = f"{v:.0f} dropout/BatchNorm layer{'s' * (v != 1)}"
    return (f"the model trained in eval mode from step {step}: {layers} ran as at "
            f"inference (dropout off, BatchNorm on running statistics it no longer "
            f"updates). Call model.train() before training; if it is deliberate (keeping "
            f"BatchNorm's statistics while fine-tuning), ignore this")


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    n = trace.scalar("eval_layers", lo, stop)[:, None]
    codes = np.where(np.isnan(n), HOLD, np.where(n > 0, WARNING, OK)).astype(np.int8)
    return [Finding("eval_mode", "mode", codes, n, per_layer=False, message=_message,
                    recovery=lambda name, s, v, p, sev: f"the model is back in training "
                                                        f"mode at step {s}")]
