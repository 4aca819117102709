"""Weights with gradients that no optimizer holds (`grad_unheld`, read from the optimizers'
parameter groups at every step, `record.membership`).

A layer replaced after the optimizer was built (`model.fc = nn.Linear(...)` after
`SGD(model.parameters())`), or layers unfrozen without adding them to the optimizer, get
gradients at every step that no optimizer applies: they never change, the loss still falls
(the rest of the model learns), and no number of theirs looks wrong. An error at the first
step it shows, naming the layer: membership is a fact of the loop, not a noisy reading, so
it needs no patience. A watched model that no optimizer trains at all (a perceptual-loss
network or a teacher left trainable) breaks nothing: a warning that its gradients are
computed for nothing.
"""

from __future__ import annotations

import numpy as np

from ..trace.columns import DETACHED, FROZEN, MODEL_CUT, REPLACED, UNTRAINED_MODEL, UNUSED, Trace
from .ran import ran as layers_ran
from .scan import ERROR, INFO, WARNING, Finding, grade
from .thresholds import Thresholds


def _message(name: str, step: int, v: float, previous: float, severity: str) -> str:
    if v == UNTRAINED_MODEL:
        return (f"{name} gets gradients from step {step} but no optimizer holds any weight "
                f"of its model: they are computed for nothing (a teacher or a loss network "
                f"left trainable). Call requires_grad_(False) on that model if it is meant "
                f"to stay fixed; otherwise give it an optimizer")
    if v == REPLACED:
        return (f"{name} was replaced after the optimizer was built: from step {step} its "
                f"weights get gradients that no optimizer holds (the optimizer still holds "
                f"the old layer's weights), so it never trains. Build "
                f"the optimizer after replacing the layer, or add it with "
                f"opt.add_param_group({{'params': layer.parameters()}})")
    return (f"{name}'s weights get gradients from step {step} that no optimizer holds, so "
            f"they never change (layers unfrozen, or made, after the optimizer was built). "
            f"Add them with opt.add_param_group({{'params': layer.parameters()}}); if the "
            f"layer is meant to stay fixed, requires_grad_(False) saves its gradients")


def _recovery(name: str, step: int, v: float, previous: float, severity: str) -> str:
    return f"{name}'s weights are held by an optimizer again at step {step}"


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    v = trace.col("grad_unheld", lo, stop)
    seen = ~np.isnan(v)
    codes = grade(seen, ((v > 0) & (v != UNTRAINED_MODEL), ERROR), (v == UNTRAINED_MODEL,
                                                                     WARNING))
    return [Finding("not_in_optimizer", "membership", codes, v, message=_message,
                    recovery=_recovery)]


def _cut_message(name: str, step: int, v: float, previous: float, severity: str) -> str:
    if v == UNUSED:
        return (f"{name} runs but its output does not reach the loss (no gradient since "
                f"step {step}, while layers before it get one): an output left unused (a "
                f"pooler, an auxiliary head). If it is meant to train, use its output in "
                f"the loss; if not, requires_grad_(False) saves computing it")
    where = ("no layer of its model gets a gradient: its output enters the loss only "
             "detached (a generator trained on fake.detach()), or its gradients are "
             "cleared between backward() and its optimizer's step" if v == MODEL_CUT else
             "its output is used (the step replayed with it changed gives another model "
             "output), yet no gradient comes back through it: a .detach() (or .item(), "
             ".numpy(), a no_grad block) stands between it and the loss, as in a residual "
             "branch added as h + block(h).detach()" if v == DETACHED else
             "layers after it get one: a .detach() (or .item(), .numpy(), a no_grad "
             "block) stands between it and the loss")
    return (f"{name} is cut off from the loss: it runs, is trainable and held by an "
            f"optimizer, yet got no gradient from step {step} on; {where}. Remove the "
            f"detach for the loss that should train it; if it is meant to stay fixed, "
            f"call requires_grad_(False)")


def cut_findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    """Layers cut off from the loss: trainable, held by an optimizer, run in the step's
    forward (`ran.ran`: measured at the step's forward, or at the last hooked one before),
    and no gradient for `cut_steps` steps in a row. Steps whose activations
    are not measured hold the verdict."""
    v = trace.col("grad_cut", lo, stop)
    ran = layers_ran(trace, lo, stop)
    measured = ran.any(axis=1, keepdims=True) | (trace.scalar("sampled", lo, stop) == 1)[:, None]
    seen = ~np.isnan(v) & measured
    cut = (v > 0) & (v != FROZEN) & ran
    codes = grade(seen, (cut & (v != UNUSED), ERROR), (cut & (v == UNUSED), INFO))
    return [Finding("cut_off", "cut", codes, v, message=_cut_message,
                    recovery=lambda name, s, v, p, sev: f"{name} gets gradients again at "
                                                        f"step {s}",
                    patience=th.cut_steps)]
