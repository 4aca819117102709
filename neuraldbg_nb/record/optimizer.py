"""The optimizers' step hooks: where a step ends, and the weights around each update.

The primary optimizer's step (`StepOwner`) ends the watch's step (`Boundary.close`): before
its update, or after it where the step is given a closure (which runs the step's forward
and backward inside it). Around the updates of sampled steps the weight probe keeps a copy
of a slice of each weight, and after every update that trains watched weights it reads
them (`WeightProbe`). A loop without an optimizer ends its steps by hand (`manual_step`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from . import reductions
from .step_owner import StepOwner
from .timing import StepTimer, clock
from .weights import WeightProbe

if TYPE_CHECKING:
    from .boundary import Boundary
    from .inputs import Inputs


class Optimizers:
    """The optimizer step hooks of one watch (`pre`, `post`) and steps ended by hand."""

    def __init__(self, steps: StepOwner, weights: WeightProbe, boundary: Boundary,
                 inputs: Inputs, timer: StepTimer, sc: reductions.Scalars) -> None:
        self._steps = steps
        self._weights = weights
        self._boundary = boundary
        self._inputs = inputs
        self._timer = timer
        self._sc = sc
        self.steps_seen = 0
        """Steps of the primary optimizer."""
        self.manual_steps = False
        """A step was ended by hand (`run.step()`)."""
        self._closure_step = False  # the primary's step in progress was given a closure
        self.others_stepped = False
        """Another optimizer of the watched weights stepped since the primary's last step
        (a GAN's generator after its discriminator): the backwards since then had their
        update, and are not a step left without one (`Probe.close_trailing`)."""

    def pre(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> bool:
        """An optimizer's step begins: the primary's closes the step (the boundary times
        itself; what comes before it is the engine's time too, `StepTimer.other_s`).
        True where the step is given a closure that the caller is to wrap
        (`with_closure`), so that the step closes when the closure returns
        (`closure_ran`)."""
        t0 = clock()
        begun = self._begin(opt, args, kwargs)
        self._timer.other_s += clock() - t0
        if begun == "close":
            self._boundary.close(opt)
        return begun == "closure"

    def _begin(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict
               ) -> Literal["close", "closure", ""]:
        """`pre` up to the step boundary: "close" where the boundary closes now, "closure"
        where it closes when the step's closure returns, "" otherwise."""
        primary = self._steps.before_step(opt, self._inputs.called_with)
        if primary is None:  # no optimizer trains the watched weights yet, nor does this one
            return ""
        if primary is opt:
            self.steps_seen += 1
            self.others_stepped = False
            self._before_update()
            # a closure runs the step's forward and backward inside the step (`args`
            # starts with the optimizer itself)
            self._closure_step = callable(kwargs.get("closure", args[1] if len(args) > 1
                                                     else None))
            if not self._closure_step:
                return "close"
            if calls_closure_once(opt):  # it closes when the closure returns, before the
                if not self._boundary.replayable:  # update: replayable where the model's
                    self._boundary.hook_closure()  # calls are heard
                return "closure"
            # it closes after the update (`post`): its forward cannot be replayed, so it is
            # hooked as it runs
            self._boundary.hook_closure()
            return ""
        if self._steps.trains_watched(opt):
            # another optimizer of the step (a GAN's generator): the layers it finds with
            # gradients had one in the step, and its update is measured on the step the
            # primary's was, and adds to it
            self._steps.membership.other_step(opt)
            self.others_stepped = True
            backwards = self._boundary.backwards
            backwards.others.at_step(opt, backwards.total_heard)
            if self._weights.measuring:
                self._weights.keep_before()
        return ""

    def closure_ran(self, opt: torch.optim.Optimizer) -> None:
        """A call of the closure of the primary's step returned (`with_closure`): the
        first one ran the step's forward and backward, and the update has not begun, so
        the step closes as one without a closure does."""
        if self._closure_step:
            self._closure_step = False
            self._boundary.close(opt)

    def post(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        """An optimizer's step (its update) ended."""
        primary = self._steps.primary
        if primary is opt:
            if self._closure_step:  # (a closure not wrapped, or never called)
                self._closure_step = False
                self._boundary.close(opt, updated=True)
            self.after_update(primary=True)
        elif primary is not None and self._steps.trains_watched(opt):
            self.after_update(primary=False)  # the weights are read after every update

    def manual_step(self) -> None:
        """End a step by hand (loops without an optimizer)."""
        self.manual_steps = True
        self.others_stepped = False
        self._boundary.close(None)
        self.after_update()

    def _before_update(self) -> None:
        """Before the update of a sampled step: the weight probe's copy that the update
        is measured against (`after_update`)."""
        if self._boundary.sampled:
            self._weights.keep_before()

    def after_update(self, primary: bool = True) -> None:
        """After an optimizer's update: the weight probe (`WeightProbe.after_update`),
        sent with the next step's transfer."""
        t0 = clock()
        self._weights.after_update(self._sc, primary)
        self._timer.other_s += clock() - t0


def calls_closure_once(opt: torch.optim.Optimizer) -> bool:
    """Does `opt.step(closure)` call the closure once, before its update? PyTorch's own
    optimizers do, L-BFGS aside (it evaluates the closure again along its line search);
    another library's may call it twice (SAM: before and after its ascent step), and is
    not assumed to."""
    return type(opt).__module__.startswith("torch.optim.") and \
        not isinstance(opt, torch.optim.LBFGS)


def with_closure(args: tuple, kwargs: dict, ran: Callable[[], None]
                 ) -> tuple[tuple, dict]:
    """`optimizer.step`'s arguments (`args` starts with the optimizer) with its closure
    wrapped: `ran` is called each time a call of it returns, before its result goes to
    the optimizer."""
    closure = kwargs["closure"] if "closure" in kwargs else args[1]

    def closes() -> Any:
        loss = closure()
        ran()
        return loss

    if "closure" in kwargs:
        return args, {**kwargs, "closure": closes}
    return (args[0], closes, *args[2:]), kwargs


def learning_rate(opt: torch.optim.Optimizer | None,
                  sc: reductions.Scalars) -> tuple[float, int]:
    """The step's learning rate, the largest of its parameter groups' (a head trained
    faster than its backbone, a group whose rate a scheduler raised: the rate that moves
    weights most, which a change is read on): (its value, -1) where they are numbers,
    (NaN, the first group's position on `sc`) where it is a tensor (a scheduler's on a
    device), (NaN, -1) without an optimizer."""
    if opt is None or not opt.param_groups:
        return math.nan, -1
    lrs = [g.get("lr", math.nan) for g in opt.param_groups]
    if isinstance(lrs[0], torch.Tensor):
        return math.nan, sc.add(lrs[0].detach())
    if len(lrs) > 1 and all(isinstance(lr, (int, float)) for lr in lrs):
        return float(max(lrs)), -1
    return float(lrs[0]), -1


def missing_gradients(opt: torch.optim.Optimizer | None, backward_ran: bool, any_grad: bool,
                      params: list[tuple[str, nn.Parameter, int]]) -> float:
    """1.0 where a backward ran in the step but, at the optimizer's step, no watched
    weight held a gradient although some are trainable: the gradients were cleared
    between the backward and the step (`zero_grad()` after `backward()`), or the loss
    does not depend on the model (its output detached). Nothing trains, and nothing
    else says so. 0.0 where some weight had one, NaN where it cannot be told (no
    backward heard; a step closed by hand, whose loop may clear them on purpose)."""
    if opt is None or not backward_ran:
        return math.nan
    if any_grad:
        return 0.0
    return 1.0 if any(p.requires_grad for _, p, _ in params) else math.nan
