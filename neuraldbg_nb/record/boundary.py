"""Closing a step: its numbers, queued on the device while it ran, go to the host in one
transfer and become one trace row.

What the step's parts queued (the layers' extremes and statistics, the input batches, the
losses, the last update's weight slices) is joined by the gradients' norms, read here, and
the learning rate; one `Scalars.to_host` brings them all back, and each part reads its own
numbers out of it into the row (`step_row`). The last update's weight norms go into the
row of the step it ended, one step late (`WeightProbe.record`). Then the watch is told
(`on_step`: detection, captures), and the next step's sampling is decided.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..trace.columns import Trace
from . import reductions, step_row
from .backward import Backwards
from .discovery import Models
from .forward import Forward, Held
from .inputs import Inputs
from .optimizer import learning_rate, missing_gradients
from .sampler import is_reference_step
from .step_owner import StepOwner
from .timing import StepTimer, clock
from .weights import WeightProbe


@dataclass
class StepRecord:
    """What a closed step hands on: its index and live references for capture.

    `refs` maps a layer index to the (input, output) of its last call in the step; they
    are valid only during the callback (the probe drops them right after).
    """

    step: int
    refs: Held = field(default_factory=dict)
    batch: torch.Tensor | None = None
    params: list[tuple[str, nn.Parameter, int]] = field(default_factory=list)


class Boundary:
    """The step boundary of one watch, and the step's sampling decision."""

    def __init__(self, trace: Trace, models: Models, forward: Forward, inputs: Inputs,
                 backwards: Backwards, weights: WeightProbe, steps: StepOwner,
                 sc: reductions.Scalars, timer: StepTimer,
                 on_step: Callable[[StepRecord], None]) -> None:
        self._trace = trace
        self._models = models
        self._forward = forward
        self._inputs = inputs
        self._backwards = backwards
        self._weights = weights
        self._steps = steps
        self._sc = sc
        self._timer = timer
        self._on_step = on_step
        self.sampled = True
        """The step in progress gets the full statistics."""
        self.new_step()

    def new_step(self) -> None:
        """The parts start a step: sampled ones (and reference steps) hold every layer's
        tensors for capture."""
        sampled = self.sampled
        self._forward.new_step(sampled, sampled or is_reference_step(self._trace.n_steps))
        self._inputs.new_step(sampled)
        self._backwards.new_step()

    @property
    def pending(self) -> bool:
        """Something was recorded since the last step boundary."""
        return self._forward.pending or self._backwards.pending or self._inputs.pending

    def close(self, opt: torch.optim.Optimizer | None) -> None:
        """The step boundary (`opt`: the primary optimizer, None for a step ended by hand):
        the step's numbers go to the host in one transfer and become one trace row, with
        the last update's weights (`WeightProbe`) and whether the gradients were zeroed
        (`CarryCheck`); then `on_step` (detection, capture) and the next step's sampling
        decision."""
        t_enter = clock()
        sc, trace = self._sc, self._trace
        params = self._models.params()
        with_grad = [(g, idx) for _, p, idx in params if (g := p.grad) is not None]
        g_pos = reductions.grouped_norms([g for g, _ in with_grad], sc)
        missing = missing_gradients(opt, self._backwards.any_heard, bool(with_grad), params)
        self._forward.queue()
        lr_host, lr_pos = learning_rate(opt, sc)
        t_x = clock()
        v = sc.to_host()  # the step's one device-to-host transfer
        if sc.from_device:  # it waited for the device work queued before it, mostly the
            self._timer.other_s -= clock() - t_x  # training's: not the engine's time

        step = trace.n_steps
        n = trace.n_layers
        row: dict[str, np.ndarray] = self._forward.columns(v, n)
        # the last update's weight norms (`WeightProbe`) go into the last row, in one
        # pass with this step's gradient norms
        norms = step_row.layer_norms(v, [(g_pos, [i for _, i in with_grad])]
                                     + (self._weights.parts() if step > 0 else []), n)
        row["grad_norm"] = norms[0]
        self._weights.record(trace, step - 1, norms[1:], v)

        eval_layers = self._backwards.eval_layers
        scalars = {"lr": v[lr_pos] if lr_pos >= 0 else lr_host,
                   "loss": self._backwards.loss(v),
                   "sampled": float(self.sampled),
                   "eval_layers": eval_layers if eval_layers >= 0 else math.nan,
                   "grad_carried": self._backwards.carried(opt, params, v),
                   "grads_missing": missing}
        if self._steps.input_trained:  # (`StepOwner.input_trained`)
            self._inputs.drop()
        scalars.update(self._inputs.read(v))
        trace.append(row, scalars)

        held = self._forward.held
        record = StepRecord(step, held, self._inputs.batch, params)
        self.sampled = self._timer.next_sampled(step, self.sampled, t_enter)
        self.new_step()
        try:
            self._on_step(record)
        finally:
            held.clear()
            self._timer.end_interval(step, t_enter)

    def flush(self) -> None:
        """At exit: the last update's weight norms go into the last row."""
        if self._weights.flush(self._trace, self._sc):
            self.new_step()
