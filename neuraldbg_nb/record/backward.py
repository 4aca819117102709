"""What the backwards of a step tell: the loss (the tensor `backward()` was called on,
unscaled where a GradScaler scaled it, or what `run.log_loss` was given), whether each starts on the last step's gradients
(`CarryCheck`), how many watched layers were in eval mode as it started, and, on
sampled steps, how the loss was built (`loss_form`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..trace.columns import REAPPLIED
from . import loss_form, reductions, step_row
from .amp_scale import ScaleReader, ScaleTrail
from .carried import CarryCheck, OtherCarries
from .discovery import Models


class Backwards:
    """The backwards of one watch's step, queued on the step's `Scalars`."""

    def __init__(self, models: Models, sc: reductions.Scalars) -> None:
        self._models = models
        self._sc = sc
        self._carry = CarryCheck()
        self._scales = ScaleReader()
        self._trail = ScaleTrail()
        self.others = OtherCarries()
        """The same checks for the other optimizers of the step (a GAN's second)."""
        self.total_heard = 0
        """Backwards heard since the watch began."""
        self._labels: np.ndarray | None = None  # each class's labels on the sampled steps
        self._label_pos = -1  # the step's label counts on `sc` (`loss_form.labels`)
        self._classes = 0
        self._per_sample = False  # the labels counted are one per sample
        self.accumulated = False
        """The loop scales its losses for gradient accumulation (a framework does):
        the step's loss is their sum (`step_row.loss`)."""
        self.new_step()

    def new_step(self, sampled: bool = False) -> None:
        """A step starts (the last one's transfer was read); `sampled`: its first
        backward's loss graph is read (`loss_form`)."""
        self._heard: list[int] = []  # positions of the losses `backward()` was called on
        self._logged: list[int] = []  # of the tensors given to `log_loss`
        self._logged_host: list[float] = []  # the numbers given to `log_loss`
        self.roots: list[Any] = []
        """The autograd nodes the step's backwards began from (their losses' `grad_fn`):
        which of a model's outputs a loss was computed from is read from them
        (`replay.Replay.used_outputs`)."""
        self._carry.new_step()
        self._trail.new_step()
        self.eval_layers = -1
        """The most layers found in eval mode at a backward of the step; -1: none heard."""
        self._read_form = sampled
        self._label_pos = -1
        self.form = {"loss_squashed": math.nan, "loss_broadcast": math.nan,
                     "loss_chance": math.nan}
        """How the step's first loss was built (`loss_form.read`); NaN: not read. Its
        chance level is the labels' (`read_form`)."""

    def heard(self, root: torch.Tensor) -> None:
        """A backward starts from `root` (the loss tap); the loss is the unscaled one where
        `root` is a GradScaler's scaling of it (`ScaleReader`)."""
        loss = self._scales.unscaled(root)
        if self._read_form:
            self._read_form = False
            self.form = loss_form.read(root, scaled=loss is not None)
            node = root.grad_fn
            if loss is not None and node is not None and node.next_functions:
                node = node.next_functions[0][0]  # (`loss_form.read`: under the scaling)
            found = loss_form.labels(node)
            if found is not None:
                self._label_pos = self._sc.add_row(found[0])
                self._classes = found[1]
                self._per_sample = loss_form.per_sample(node)
        self._heard.append(self._sc.add(root.detach() if loss is None else loss))
        self.roots.append(root.grad_fn)
        if self._scales.scale is not None:
            self._trail.heard(self._scales.scale, self._sc)
        self._carry.at_backward(self._sc)
        self.others.at_backward(self._sc)
        self.total_heard += 1
        self.eval_layers = max(self.eval_layers, self._models.layers_in_eval())

    def log_loss(self, value: float | torch.Tensor) -> None:
        """The step's loss, given by hand (`run.log_loss`)."""
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"log_loss takes a scalar; got a tensor of shape "
                                 f"{tuple(value.shape)}. Reduce it first, e.g. loss.mean().")
            self._logged.append(self._sc.add(value.detach().reshape(())))
        else:
            self._logged_host.append(float(value))

    @property
    def pending(self) -> bool:
        """A backward was heard, or a loss logged, since the step began."""
        return bool(self._heard or self._logged or self._logged_host)

    @property
    def any_heard(self) -> bool:
        """A backward ran in the step."""
        return bool(self._heard)

    def scales(self, v: list[float]) -> dict[str, float]:
        """After the transfer `v`: the loss scales of the step's scaled backwards
        (`ScaleTrail.values`)."""
        return self._trail.values(v)

    def read_form(self, v: list[float]) -> dict[str, float]:
        """After the transfer `v`: how the step's loss was built (`form`), its chance level
        read from the labels of every sampled step so far (`loss_form.chance_level`):
        ln C for balanced classes, less where one class is most of the labels, which a
        model that learns nothing from its inputs reaches by predicting the
        frequencies; and, for labels one per sample (`loss_form.per_sample`), the class
        most of the step's are and its share (`label_top`, `label_share`, `label_n`,
        `label_classes`)."""
        form = self.form
        pos = self._label_pos
        chance = form.get("loss_chance", math.nan)
        if pos < 0 or not math.isfinite(chance):
            return form
        counts = np.asarray(v[pos:pos + self._classes])
        if self._labels is None or len(self._labels) != len(counts):
            self._labels = np.zeros(len(counts))
        self._labels += counts
        level = loss_form.chance_level(self._labels)
        read = {**form, "loss_chance": level if math.isfinite(level) else chance}
        total = float(counts.sum())
        if self._per_sample and total > 0:
            top = int(counts.argmax())
            read.update(label_top=float(top), label_share=float(counts[top]) / total,
                        label_n=total, label_classes=float(len(counts)))
        return read

    def loss(self, v: list[float]) -> float:
        """After the transfer `v`: the step's loss (`step_row.loss`)."""
        return step_row.loss(v, self._heard, self._logged, self._logged_host,
                             self.accumulated)

    def carried(self, opt: torch.optim.Optimizer | None,
                params: list[tuple[str, torch.nn.Parameter, int]], v: list[float]) -> float:
        """After the transfer `v`: whether the step's gradients were the last step's
        (`CarryCheck.judge`; NaN for a step closed by hand with no backward, a loop that
        only logs)."""
        carried = self._carry.judge(self._carry.witness(opt, params), v, len(self._heard))
        if opt is None and carried == REAPPLIED:  # `run.step()` with no backward: logging
            carried = math.nan
        return carried
