"""When the live panel sends the run (`PanelBudget`): on the measured cost of its updates.

Every update is timed (building the state and sending it: the time the panel's Python takes
from the training) and paid from a credit that grows by `BUDGET` of the wall time from
nothing when the panel is shown, so the panel takes at most `BUDGET` of the cell's time
whatever the step rate and the size of the state; the updates sent whatever the budget
are paid from it too, and the next ones wait until they are paid for. A full update
(the map, the feed, the header) goes when the credit covers the last full update's
cost, at most `MAX_RATE` times a second. Where the budget allows fewer than
one a second (a large state on a slow machine), a header update (step, status, loss, cost:
a few hundred bytes) goes in between, so that the panel refreshes at least every
`MAX_GAP` seconds; the map follows at the pace the budget allows. Updates go after a
step, so a refresh goes once the next step, were it up to twice as long as the recent
ones, could end more than `MAX_GAP` after the last update (the gap holds where steps take
well under a second; a step longer than foreseen delays it by that step). The first
update, when the panel is shown, the one after the first step (the first paint of a
step) and the final one are always sent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Literal

BUDGET = 0.02
"""The panel's share of the cell's wall time, at most."""
MAX_RATE = 10.0
"""Full updates a second at most: a faster refresh is not seen."""
MAX_GAP = 1.0
"""Seconds between two refreshes at most, while steps come faster than that."""

Kind = Literal["full", "header"]


class PanelBudget:
    """The panel's updates and their measured cost. `due()` says which update to send
    now, if any; `paid(kind, started)` records one that was sent."""

    def __init__(self, budget: float = BUDGET,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not 0 < budget <= 1:
            raise ValueError(f"the panel's budget is a fraction of the wall time in (0, 1], "
                             f"not {budget}")
        self.budget = budget
        self.clock = clock
        self.full = 0
        """Full updates sent."""
        self.header = 0
        """Header updates sent (where the budget allowed no full one within `MAX_GAP`)."""
        self.seconds = 0.0
        """Time spent building and sending updates, all of them."""
        self.forced_seconds = 0.0
        """The part of `seconds` spent on updates sent whatever the budget (the first, the
        final one, one with a new note, a re-classification)."""
        self.full_cost = 0.0
        """The last full update's cost (s): what the next one is expected to take."""
        self.peak = 0.0
        """The costliest update (s)."""
        self.first: float | None = None
        """When the first update was sent (`clock`)."""
        self.last: float | None = None
        self.max_gap = 0.0
        """The longest time between two updates (s)."""
        self._last_full = -math.inf
        self._credit = 0.0
        self._credited_at: float | None = None
        self._asked: float | None = None  # the last call of `due`: a step's end
        self._step = 0.0  # the recent steps' longest time, decaying: the next may be as long

    @property
    def updates(self) -> int:
        return self.full + self.header

    def share(self, wall: float) -> float:
        """The updates' cost as a fraction of `wall` seconds."""
        return self.seconds / wall if wall > 0 else 0.0

    def _cap(self) -> float:
        """The most credit kept: a full update's worth, so that a quiet stretch never pays
        for a burst."""
        return max(self.full_cost, self.budget * MAX_GAP)

    def _accrue(self, now: float) -> None:
        if self._credited_at is None:  # the first update: nothing yet (it is forced)
            self._credit = 0.0
        else:
            self._credit = min(self._cap(),
                               self._credit + self.budget * (now - self._credited_at))
        self._credited_at = now

    def due(self) -> Kind | None:
        """The update to send now, asked after each step: "full" when the credit covers
        one and the last was at least 1/`MAX_RATE` ago, "header" when waiting for the next
        step (up to twice the recent ones) could leave more than `MAX_GAP` since the last update,
        else None."""
        now = self.clock()
        if self._asked is not None:
            self._step = max(now - self._asked, 0.8 * self._step)
        self._asked = now
        self._accrue(now)
        if now - self._last_full >= 1.0 / MAX_RATE and self._credit >= self.full_cost:
            return "full"
        if self.last is not None and now + 2 * self._step - self.last >= MAX_GAP:
            return "header"
        return None

    def paid(self, kind: Kind, started: float, forced: bool = False) -> None:
        """Record an update of `kind` that began at `started` (`clock`) and ends now;
        `forced`: sent whatever the budget (it is charged all the same)."""
        now = self.clock()
        cost = now - started
        self._accrue(now)
        self._credit -= cost
        self.seconds += cost
        if forced:
            self.forced_seconds += cost
        self.peak = max(self.peak, cost)
        if kind == "full":
            self.full += 1
            self.full_cost = cost
            self._last_full = started
        else:
            self.header += 1
        if self.first is None:
            self.first = started
        if self.last is not None:
            self.max_gap = max(self.max_gap, started - self.last)
        self.last = started

    def __repr__(self) -> str:
        return (f"PanelBudget({self.full} full + {self.header} header updates, "
                f"{1000 * self.seconds:.1f} ms, longest gap {self.max_gap:.2f} s)")
