"""Which steps get the full activation statistics (`Sampler`), and which are reference
steps (`is_reference_step`). Both have their layer hooks on; between them the hooks are off
except at most `trace.HOOK_GAP` steps after the last hooked one (`record.boundary`)."""

from __future__ import annotations


def is_reference_step(step: int) -> bool:
    """The reference steps, 0, 1, 2, 4, 8, ...: dense early, sparse later, log2(steps) in all: every
    layer's tensors are held for capture there, and their cost is not the steady cost."""
    return step == 0 or (step & (step - 1)) == 0


class Sampler:
    """Which steps get the full activation statistics.

    Every `every`-th step by default. With an `overhead` budget (a fraction of the step
    time), the interval grows where the statistics cost more than the budget allows: the
    time spent computing them on a sampled step, over the loop's step without the
    engine's time, divided by what the per-step work leaves of the budget (at least a
    quarter of it), is the interval that holds it (it only grows, by doublings).
    Non-finite values are still caught every step by the cheap path, whatever the
    interval. Because the budget is measured in time, which steps are sampled can differ
    between two runs of the same training; `overhead=None` gives a fixed, reproducible
    schedule.
    """

    MAX_INTERVAL = 1000

    def __init__(self, every: int, overhead: float | None) -> None:
        self.every = every
        self.overhead = overhead
        self.interval = every
        self._next = 0

    def next(self, step: int, sampled: bool, spent: float, plain: float,
             floor: float) -> bool:
        """Called when `step` closes, with the seconds its full statistics took, the
        seconds of the loop's step without the engine, and the per-step work's share
        of it (`SelfCost.floor`); True if step + 1 is to be sampled."""
        if self.overhead and spent > 0 and plain > 0:
            need = spent / plain / max(self.overhead - floor, self.overhead / 4)
            while self.interval < min(need, self.MAX_INTERVAL):
                self.interval *= 2  # only grows, in doublings: few distinct schedules
        if sampled:
            self._next = step + self.interval
        return step + 1 >= self._next
