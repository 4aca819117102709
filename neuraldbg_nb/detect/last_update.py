"""The run's last update, judged as the step after it would judge it.

A weight's norm after an update is read at the next step boundary, so the update of step t
is judged at row t + 1 (`updates`: `step_offset=-1`). The last update of a run has no next
step: its norms are written into the last row as the watch ends (`Trace.ended`), and here
the update detectors read one more row, a step with nothing else recorded, from the state
detection has reached, so that an update that blows the weights up as the run ends (a
learning rate set 1000x at the last step) is an event of that step like any other.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..trace.columns import Trace
from . import updates
from .events import Event
from .scan import Carry, scan
from .thresholds import Thresholds


class _NextRow:
    """`trace` and one step after its last: NaN in every column (nothing recorded)."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trace, name)

    @property
    def n_steps(self) -> int:
        return self._trace.n_steps + 1

    def col(self, name: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
        return self._padded(self._trace.col, name, start, stop)

    def scalar(self, name: str, start: int | None = None, stop: int | None = None
               ) -> np.ndarray:
        return self._padded(self._trace.scalar, name, start, stop)

    def _padded(self, read: Any, name: str, start: int | None, stop: int | None
                ) -> np.ndarray:
        n = self._trace.n_steps
        stop = n + 1 if stop is None else stop
        real = read(name, start, min(stop, n))
        extra = max(stop - n, 0)
        if not extra:
            return real
        return np.concatenate([real, np.full((extra, *real.shape[1:]), np.nan, real.dtype)])


def last_update_events(trace: Trace, th: Thresholds, carries: dict[tuple[str, str], Carry],
                       events: list[Event], history: int) -> list[Event]:
    """The events the update detectors find at the step after the last one of an ended
    trace (`Trace.ended`), dated at the last step; `carries` and `events`: detection's
    state and events after the last step (the carries point into the events; both are
    left as they are); `history`: the rows before that the detectors read. None where the
    trace goes on, or has no steps."""
    n = trace.n_steps
    if not trace.ended or n <= trace.full_from:
        return []
    names = [(info.name, info.label) for info in trace.layers]
    lo = max(trace.full_from, n - history)
    found = list(events)
    for f in updates.findings(_NextRow(trace), lo, n + 1, th):  # type: ignore[arg-type]
        carry = copy.deepcopy(carries.get((f.kind, f.signal)) or Carry())
        scan(f, carry, n, names, th.patience, found, n - lo)
    return found[len(events):]
