"""What watching costs: the engine's own time in each training step, measured as it runs.

The probe times everything it does (the layer hooks, the input and loss taps, the step
boundary with detection and captures, the weight probe after the update) and records one
interval per step: from the end of one step boundary to the end of the next, which is the
loop's step. `Overhead` summarises the recent steps as what a user pays for watching, a
fraction of what the loop costs without it; `run.overhead` gives it and `print(run)` ends
with it.

It is an estimate from inside, not the benchmark: PyTorch's own cost of calling a hook
(a few microseconds per hooked layer call), which no hook can time, is measured once per
process and charged per layer call recorded (`record.timing.dispatch_s`), and the
engine's reads bring data into the caches that the training reads next (the gradients,
before the optimizer does), which makes them look dearer than they are. Nothing is given
during the warm-up: before `STEADY` steps are recorded, nor, before `SETTLED`, while the
estimate still moves. `benchmarks/overhead.py` times whole
steps, watched against plain. On an accelerator it is the host's time: the step's one
transfer waits for the device work queued before it, mostly the training's own, and that
wait is left out, as are the engine's kernels, which run asynchronously among the
training's.

With an overhead budget (`watch(..., overhead=0.02)`) the full statistics of sampled
steps get what the rest leaves of it (`sampler.Sampler`). Sampling cannot lower the rest
(every layer's non-finite check, one read of every gradient, detection, the trace):
where it alone takes more than the budget, `budget_note` says so once, with the numbers
and what does lower it.
"""

from __future__ import annotations

import time

import numpy as np

from ..record.sampler import is_reference_step
from ..report.overhead import Overhead

WINDOW = 256
"""Recent steps summarised (a ring: memory stays fixed however long the run)."""
WARMUP = 8
"""First steps left out: layers are found and the first reference captures taken then.
Later reference steps (16, 32, 64, ...: each copies every layer's tensors, ever more
rarely) are left out too: over a run of thousands of steps they weigh nothing, but in
the first hundred they would make a budget look unholdable that is held."""
STEADY = 12
"""Steps recorded (after `WARMUP`) before any figure is given: the first steps' costs
(allocations, caches, the first captures) say nothing of what a step costs later, and a
figure from them would alarm for nothing."""
SETTLED = 24
"""Steps recorded after which the figure is given even where it has not settled
(`_settled`): a loop whose cost keeps moving is told what it costs all the same."""
CHECK_EVERY = 32
"""Steps recorded between two looks at the budget (and before the first)."""


class SelfCost:
    """The engine's time per step, for the recent `WINDOW` steps."""

    def __init__(self, budget: float | None = None) -> None:
        """`budget`: the watch's `overhead`, or None (no budget to hold)."""
        self.budget = budget
        self.recorded = 0
        self._rows = np.zeros((WINDOW, 4))  # wall, own, hooks, sampled (seconds)
        self.note: str | None = None
        """The budget note, once given (`budget_note`)."""
        self.own_s = 0.0
        """The engine's time for the run so far (s): every step's, warm-up and reference
        steps too, and the blocks' start and end (`left`) and what was spent for it
        outside them (`outside`)."""
        self._wall_s = 0.0  # the time of the blocks closed so far, and of `outside`
        self._entered: float | None = None  # when the open block began (`time.perf_counter`)
        self._over = False  # a block ended, none runs now

    def record(self, step: int, wall: float, own: float, hooks: float,
               sampled: float) -> None:
        """One step: its wall time, the engine's time in it, and of that the layer hooks'
        non-finite checks and the full statistics (warm-up and reference steps are left
        out: `WARMUP`); every step counts in the whole run's cost (`whole`)."""
        self.own_s += own
        if step < WARMUP or is_reference_step(step):
            return
        self._rows[self.recorded % WINDOW] = (wall, own, hooks, sampled)
        self.recorded += 1

    def entered(self, at: float) -> None:
        """A block of the watch began at `at` (`time.perf_counter`)."""
        self._entered = at
        self._over = False

    def left(self, own: float) -> None:
        """The open block ends now; `own`: the engine's time in its start and end outside
        any step (the time of the steps it closed there came with them, `record`)."""
        if self._entered is not None:
            self._wall_s += time.perf_counter() - self._entered
            self._entered = None
        self.own_s += own
        self._over = True

    def outside(self, seconds: float) -> None:
        """Time spent for the run outside its blocks (a cell's panel made before it, its
        diagnosis after): the run's time and the engine's both grow by it."""
        self.own_s += seconds
        self._wall_s += seconds

    def whole(self) -> tuple[float, float] | None:
        """(the engine's time over the watched time without it, the engine's time in s)
        over the whole run so far, everything counted; None before it is measured."""
        wall = self._wall_s
        if self._entered is not None:
            wall += time.perf_counter() - self._entered
        plain = wall - self.own_s
        if self.own_s <= 0 or plain <= 0:
            return None
        return self.own_s / plain, self.own_s

    def summary(self) -> Overhead | None:
        """The recent steps' cost; None before there is one to give: fewer than `STEADY`
        steps recorded, or, while a block runs, fewer than `SETTLED` whose two halves
        disagree (`_settled`; once the block is over, what it cost is said as it was)."""
        n = min(self.recorded, WINDOW)
        if n < STEADY or (not self._over and self.recorded < SETTLED
                          and not self._settled(n)):
            return None
        return self._summary(n)

    def _summary(self, n: int) -> Overhead | None:
        """The `n` recent steps' cost, however few (the budget's checks read it)."""
        if n == 0:
            return None
        wall, own, hooks, sampled = self._rows[:n].T
        step = float(np.median(wall - own))
        if step <= 0:
            return None
        mean_own = float(own.mean())
        whole = self.whole()
        return Overhead(fraction=mean_own / step, own_ms=mean_own * 1e3, step_ms=step * 1e3,
                        hooks_ms=float(hooks.mean()) * 1e3,
                        sampled_ms=float(sampled.mean()) * 1e3, steps=n,
                        whole=None if whole is None else whole[0],
                        whole_s=None if whole is None else whole[1])

    def _settled(self, n: int) -> bool:
        """Do the older and the newer half of the `n` recent steps give about the same
        share (within a factor of 1.5, or 2 points apart)?"""
        rows = self._rows[:n]
        shares = []
        for half in (rows[: n // 2], rows[n // 2:]):
            wall, own = half[:, 0], half[:, 1]
            step = float(np.median(wall - own))
            if step <= 0:
                return False
            shares.append(float(own.mean()) / step)
        a, b = sorted(shares)
        return b - a <= 0.02 or b <= 1.5 * a

    def floor(self) -> float:
        """`Overhead.floor` of the recent steps (0 until `CHECK_EVERY` steps are in)."""
        if self.recorded < CHECK_EVERY:
            return 0.0
        o = self._summary(min(self.recorded, WINDOW))
        return o.floor if o is not None else 0.0

    def budget_note(self, activations: bool) -> str | None:
        """Once, where what the engine does whatever the sampling (`Overhead.floor`)
        takes more than the budget: a note that says by how much and what lowers it; None
        otherwise. Looked at every `CHECK_EVERY` steps, over the recent ones.
        `activations`: whether the layer hooks are on (the advice differs)."""
        if self.budget is None or self.note is not None or self.recorded < CHECK_EVERY \
                or self.recorded % CHECK_EVERY:
            return None
        o = self._summary(min(self.recorded, WINDOW))
        if o is None or o.floor <= self.budget:
            return None
        per_step = o.own_ms - o.sampled_ms
        # (a budget under 0.1% keeps its digits: 0.0001 is 0.01%, not 0.0%)
        budget = f"{self.budget:.1%}" if self.budget >= 0.001 else f"{self.budget * 100:.2g}%"
        text = (f"the overhead budget of {budget} cannot be held: what neuraldbg "
                f"does whatever the sampling takes {o.floor:.1%} of this loop's step "
                f"({per_step:.2f} ms of {o.step_ms:.1f} ms): layer hooks (a non-finite "
                f"check of every layer's output) {o.hooks_ms:.2f} ms, and reading every "
                f"gradient and a slice of every weight, detection, captures and the trace "
                f"{per_step - o.hooks_ms:.2f} ms.")
        if activations and o.hooks_ms > 0:
            text += (" watch(..., activations=False) drops the layer hooks and still "
                     "watches gradients, weights, the loss and the input.")
        text += " The share is smaller where a step does more work (a larger batch)."
        self.note = text
        return text
