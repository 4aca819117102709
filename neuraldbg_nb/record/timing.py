"""The probe's own time in each step of the loop, and what it decides.

One interval per step, from the end of one step boundary to the end of the next (the
loop's step), and in it the engine's own time: the layer hooks' per-call checks and full
statistics (kept by `forward.Forward`, whose hook adds to them on every call), PyTorch's
cost of calling each of those hooks (`dispatch_s`, which no hook can time itself), and
everything else (the input batch, the loss tap, the weight probe, the step boundary with
detection and captures). Each interval goes to a `CostMeter`, and what the full
statistics cost decides which step is sampled next (`sampler.Sampler`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

import torch
from torch.nn.modules import module as nn_module

from .sampler import Sampler

if TYPE_CHECKING:
    from .forward import Forward

clock = time.perf_counter
"""The clock of the engine's self-timing (a module attribute: one lookup on every layer
call)."""

_dispatch: list[float] = []


DISPATCH_GUESS = 3e-6
"""`dispatch_s` where it cannot be measured without the program hearing it: a few
microseconds, PyTorch's cost of calling a hook on a CPU of these years."""


def dispatch_s() -> float:
    """PyTorch's own cost of calling one forward hook (seconds), which no hook can time
    from inside: measured once per process, as the difference between calls of a small
    module with a forward hook that does nothing and without one (the least of three
    rounds of 200 calls each, so a busy machine's pauses do not count). While global
    module hooks are installed (a FLOP counter of the program's, a watch with no model)
    they would hear those calls: `DISPATCH_GUESS` then, and the measurement waits for a
    watch made without them."""
    if not _dispatch and any((nn_module._global_forward_hooks,
                              nn_module._global_forward_pre_hooks,
                              nn_module._global_backward_hooks,
                              nn_module._global_backward_pre_hooks)):
        return DISPATCH_GUESS
    if not _dispatch:
        m, x = torch.nn.Identity(), torch.zeros(1)

        def rounds() -> float:
            best = float("inf")
            for _ in range(3):
                t0 = clock()
                for _ in range(200):
                    m(x)
                best = min(best, clock() - t0)
            return best / 200

        plain = rounds()
        h = m.register_forward_hook(lambda mod, args, out: None)
        try:
            hooked = rounds()
        finally:
            h.remove()
        _dispatch.append(max(hooked - plain, 0.0))
    return _dispatch[0]


class CostMeter(Protocol):
    """Where the probe records its own time, step by step (`live.selfcost.SelfCost`)."""

    def record(self, step: int, wall: float, own: float, hooks: float,
               sampled: float) -> None: ...

    def floor(self) -> float: ...


class StepTimer:
    """The engine's time since the last step boundary, and the step's interval."""

    def __init__(self, cost: CostMeter, sampler: Sampler, layers: Forward) -> None:
        """`layers`: the forward hooks, whose own time (`hook_s`, `rich_s`) is theirs to
        add to and counted here."""
        self.cost = cost
        self.sampler = sampler
        self._layers = layers
        self.other_s = 0.0
        """The engine's time this step outside the layer hooks (seconds); each part adds
        its own."""
        self._interval_start = clock()
        self.dispatch = dispatch_s()
        """PyTorch's cost of calling one hook (`dispatch_s`), charged per layer call
        recorded."""

    def start(self) -> None:
        """A block of the watch begins: the time outside it (a re-entered watch) is no
        step of the loop."""
        self._interval_start = clock()

    def own(self, t_enter: float, now: float) -> float:
        """The engine's time in this step so far: its hooks', and the step boundary's
        since `t_enter`."""
        layers = self._layers
        return (layers.hook_s + layers.rich_s + self.other_s + (now - t_enter)
                + layers.calls * self.dispatch)

    def next_sampled(self, step: int, sampled: bool, t_enter: float) -> bool:
        """Whether the step after `step` gets the full statistics (`Sampler`), told what
        this step's cost so far."""
        spent, floor = self._layers.rich_s, 0.0
        if spent > 0 and self.sampler.overhead:
            floor = self.cost.floor()
        now = clock()
        plain = now - self._interval_start - self.own(t_enter, now)
        return self.sampler.next(step, sampled, spent, plain, floor)

    def end_interval(self, step: int, t_enter: float) -> None:
        """The step boundary's end: the step's time and the engine's part of it go to
        `cost`, and the next step starts."""
        now = clock()
        layers = self._layers
        self.cost.record(step, now - self._interval_start, self.own(t_enter, now),
                         layers.hook_s + layers.calls * self.dispatch, layers.rich_s)
        self._interval_start = now
        layers.hook_s = layers.rich_s = self.other_s = 0.0
        layers.calls = 0
