"""Mistakes of the training loop itself, which break nothing that other detectors see.

- A model left in `model.eval()` after an evaluation trains without dropout, and its
  BatchNorm normalises with running statistics it no longer updates: the loss still
  falls. A notebook that evaluates in one cell and trains again in the next, without
  `model.train()`, does exactly this. The probe counts the layers that act by mode as
  each backward starts (`eval_layers`). A warning from its first step; held for
  `eval_steps` steps in a row, an error (the first failure, dated from the warning's
  step).
- A loop without `zero_grad()` adds every batch's gradient to all the earlier ones: the
  updates grow step after step, and what shows, dozens of steps later, is a layer dying
  or jumping, which would be blamed. The probe tells whether a step's gradients still held the
  last step's (`grad_carried`); it is an error from its first step, so the root cause is
  the loop, not the layer it broke. Clipping or unscaling the gradients in place
  does not hide it: the probe reads one gradient's values as each backward starts.
- A loop that calls `optimizer.step()` twice after one backward applies the same gradients
  twice: the steps are twice as large as the learning rate says, and the watch counts
  two steps per batch (`grad_carried` is `trace.REAPPLIED` at the second); a warning.
  Both are judged for every optimizer: the others' (a GAN's second) are `others_carried`.
- A loop that clears the gradients between the backward and the optimizer's step
  (`zero_grad()` after `backward()`), or whose loss does not depend on the model, trains
  nothing: every gradient is missing at the step, and detectors of gradients see no
  numbers at all. The probe tells it (`grads_missing`); an error. So is every gradient
  exactly 0 at the step (`trace.ZEROED`: zeroed in place, clipped to a norm of 0) where
  the loss is not 0, which an exact fit's is.
- A loop that builds its optimizer inside the loop makes a new one at every step: its
  state starts over each time (Adam's running averages, SGD's momentum), so every update
  is a first one (Adam's: the learning rate times the gradient's sign), and a scheduler
  built for the first optimizer no longer moves the rate. The probe tells a step whose
  optimizer, of a kind that keeps state, stepped for the first time with none
  (`opt_fresh`); two such steps in a row after the first are a warning, dated from the
  first of them. An optimizer made anew once an epoch is not judged.
"""

from __future__ import annotations

import numpy as np

from ..trace.columns import REAPPLIED, ZEROED, Trace
from .scan import ERROR, WARNING, Finding, grade
from .thresholds import Thresholds


def _eval_message(name: str, step: int, v: float, previous: float, severity: str,
                  steps: int) -> str:
    layers = f"{v:.0f} dropout/BatchNorm layer{'s' * (v != 1)}"
    # the error's step is where the stretch reached `steps`: it began before it
    when = f"for {steps} steps in a row by step {step}" if severity == "error" else \
        f"from step {step}"
    return (f"the model trained in eval mode {when}: {layers} ran as at "
            f"inference (dropout off, BatchNorm on running statistics it no longer "
            f"updates). Call model.train() before training; if it is deliberate (keeping "
            f"BatchNorm's statistics while fine-tuning), ignore this")


def _carry_message(name: str, step: int, v: float, previous: float, severity: str) -> str:
    return (f"gradients not zeroed between steps from step {step}: each backward adds to "
            f"the gradients of every earlier step, so the updates grow step after step. "
            f"Call optimizer.zero_grad() once per step (before the backward)")


def _repeat_message(name: str, step: int, v: float, previous: float, severity: str) -> str:
    return (f"optimizer.step() ran again at step {step} without a backward since the step "
            f"before: the same gradients were applied twice, a step twice the size the "
            f"learning rate says (each call is counted as a step). Call it once per backward")


def _missing_message(name: str, step: int, v: float, previous: float, severity: str) -> str:
    if v == ZEROED:
        return (f"every gradient was exactly 0 at the optimizer's steps from step {step}, "
                f"though backward ran and the loss is not 0: nothing trains. The gradients "
                f"were zeroed or scaled to 0 between backward() and the step "
                f"(zero_grad() after backward(), clip_grad_norm_ with a max_norm of 0, a "
                f"loss multiplied by 0): zero them before backward(), clip to a norm above 0")
    return (f"no gradient reached the model's weights at the optimizer's steps from step "
            f"{step}, though backward ran: nothing trains. The gradients were cleared "
            f"between backward() and the step (zero_grad() belongs before backward()), or "
            f"the loss does not depend on the model (its output detached)")


def _remade_message(name: str, step: int, v: float, previous: float, severity: str) -> str:
    return (f"the optimizer is made anew at every step from step {step} (built inside the "
            f"loop): its state starts over each time (Adam's running averages, SGD's "
            f"momentum), so every update is a first one (Adam's: the learning rate times "
            f"the gradient's sign), and a scheduler built for the first optimizer no longer "
            f"moves the rate. Build the optimizer once, before the loop")


def _remade(fresh: np.ndarray) -> np.ndarray:
    """Rows whose step, and the step before, each began a fresh optimizer (`opt_fresh`):
    one made anew, not the run's first; NaN where either is not recorded."""
    before = np.concatenate([[np.nan], fresh[:-1]])
    out = ((fresh > 0) & (before > 0)).astype(np.float64)
    out[np.isnan(fresh) | np.isnan(before)] = np.nan
    return out


def _codes(values: np.ndarray, code: int) -> np.ndarray:
    """`code` where a count or flag is above 0, OK at 0, HOLD where not measured."""
    return grade(~np.isnan(values), (values > 0, code))


def history(th: Thresholds) -> int:
    """Steps before a chunk that `findings` reads: the `window`, or the `eval_steps` that a
    long stretch in eval mode is counted over."""
    return max(th.window, th.eval_steps) + 2


def _held_in_eval(n: np.ndarray, steps: int) -> np.ndarray:
    """Rows at which the model was in eval mode, and in training mode at none of the
    `steps` - 1 rows before (a row without a backward, NaN, does not break the stretch)."""
    on = n[:, 0] > 0
    off = (n[:, 0] == 0).astype(np.int64)
    counts = np.concatenate([[0], np.cumsum(off)])
    rows = np.arange(len(on))
    start = rows - steps + 1
    ok = start >= 0
    clean = counts[rows + 1] - counts[np.maximum(start, 0)] == 0
    return (on & ok & clean)[:, None]


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    n = trace.scalar("eval_layers", lo, stop)[:, None]
    long_held = _held_in_eval(n, th.eval_steps)
    # every optimizer is judged: the one that closes the steps, and the others (a GAN's
    # second, `others_carried`), the worst of them
    carried = np.fmax(trace.scalar("grad_carried", lo, stop),
                      trace.scalar("others_carried", lo, stop))[:, None]
    repeated = (carried == REAPPLIED).astype(np.float64)
    repeated[np.isnan(carried)] = np.nan
    carried = np.where(carried == REAPPLIED, 0.0, carried)
    missing = trace.scalar("grads_missing", lo, stop)[:, None].copy()
    remade = _remade(trace.scalar("opt_fresh", lo, stop))[:, None]
    # gradients all exactly 0 at an exact fit (a loss of 0): nothing is left to learn
    missing[(missing[:, 0] == ZEROED) & (trace.scalar("loss", lo, stop) == 0)] = 0.0
    return [
        Finding("eval_mode", "mode", grade(~np.isnan(n), (n > 0, WARNING), (long_held, ERROR)),
                n, per_layer=False,
                message=lambda name, s, v, p, sev: _eval_message(name, s, v, p, sev,
                                                                 th.eval_steps),
                recovery=lambda name, s, v, p, sev: f"the model is back in training mode "
                                                    f"at step {s}"),
        # two steps in a row: a loop that zeroes its gradients every other step (one
        # optimizer step per two batches, written wrong) shows only some steps carried
        Finding("grads_not_zeroed", "zeroing", _codes(carried, ERROR), carried,
                per_layer=False, patience=2, message=_carry_message,
                recovery=lambda name, s, v, p, sev: f"gradients zeroed between steps again "
                                                    f"at step {s}"),
        Finding("step_repeated", "zeroing", _codes(repeated, WARNING), repeated,
                per_layer=False, message=_repeat_message,
                recovery=lambda name, s, v, p, sev: f"one optimizer step per backward again "
                                                    f"at step {s}"),
        Finding("no_gradients", "zeroing", _codes(missing, ERROR), missing,
                per_layer=False, patience=2, message=_missing_message,
                recovery=lambda name, s, v, p, sev: f"gradients reach the weights again at "
                                                    f"step {s}"),
        Finding("optimizer_remade", "optimizer", _codes(remade, WARNING), remade,
                per_layer=False, patience=2, message=_remade_message,
                recovery=lambda name, s, v, p, sev: f"the optimizer keeps its state again "
                                                    f"from step {s}"),
    ]
