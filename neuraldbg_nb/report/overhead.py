"""What watching cost a run: `Overhead`, the engine's time per step and its share of the
loop's step, as measured while it trained (`live.selfcost.SelfCost`) or as saved."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Overhead:
    """The debugger's cost per step over the recent steps (up to `live.selfcost.WINDOW`).

    Times are means over the steps (detection scans and event captures included: the
    user pays them too; the warm-up's reference captures are not, see `live.selfcost.WARMUP`), except
    `step_ms`, a median, so that an evaluation pass or a pause between two steps does not
    count as the loop's step."""

    fraction: float
    """own_ms / step_ms: how much longer a step takes watched than plain."""
    own_ms: float
    """The engine's time per step."""
    step_ms: float
    """The loop's step without the engine's time (median)."""
    hooks_ms: float
    """Of own_ms: the layer hooks' non-finite check (one reduction per layer call) and
    PyTorch's cost of calling them (estimated per call from a calibration)."""
    sampled_ms: float
    """Of own_ms: the full statistics of sampled steps, spread over every step."""
    steps: int
    """Steps summarised."""
    whole: float | None = None
    """The engine's time over the whole watch, as a fraction of the watched time without
    it: how much longer the run took watched than plain, everything counted (the start
    and end of each block, the first steps' captures, the final scan, the panel; under
    `%%neuraldbg`, the cell's setup and its diagnosis too). Over a long run it is the
    per-step `fraction`; over a short one, which pays its start and end on few steps,
    it is more. None where not measured (a run saved without it)."""
    whole_s: float | None = None
    """The engine's time over the whole watch, in seconds (see `whole`)."""

    @property
    def floor(self) -> float:
        """All but the full statistics, as a fraction of the step: what sampling them less
        often cannot lower."""
        return (self.own_ms - self.sampled_ms) / self.step_ms

    def __str__(self) -> str:
        text = (f"neuraldbg's own time: {self.own_ms:.2f} ms a step, +{self.fraction:.1%} "
                f"on the loop's {self.step_ms:.1f} ms (last {self.steps} steps; layer hooks "
                f"{self.hooks_ms:.2f} ms, full statistics {self.sampled_ms:.2f} ms)")
        if self.whole is not None and self.whole_s is not None:
            text += (f"; over the whole run, its start and end included, "
                     f"+{self.whole:.1%} ({self.whole_s:.2f} s)")
        return text


class CostSource(Protocol):
    """What a live run's cost meter gives a `Run`: the summary of its recent steps, and
    the note it gave where an overhead budget could not be held."""

    note: str | None

    def summary(self) -> Overhead | None: ...
