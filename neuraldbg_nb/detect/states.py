"""The health map: each layer's state at each step, painted from the events.

Stored as intervals (one per warning or error event), not as a steps x layers array, so a
long run costs memory per event; `bucketed` gives the worst state per column of a map of
any width directly from the intervals.
"""

from __future__ import annotations

import numpy as np

from .events import Event

LEVEL = {"warning": 2, "error": 3}
"""Map codes: 0 no data, 1 healthy, 2 warning, 3 error (the panel uses the same)."""


class StateMap:
    def __init__(self, events: list[Event], n_steps: int, n_layers: int) -> None:
        self.n_steps, self.n_layers = n_steps, n_layers
        painted = [e for e in events if e.order >= 0 and e.severity in LEVEL]
        self.layer = np.array([e.order for e in painted], np.int64)
        self.start = np.array([e.step for e in painted], np.int64)
        self.stop = np.array([n_steps if e.end is None else max(e.end, e.step + 1)
                              for e in painted], np.int64)
        self.level = np.array([LEVEL[e.severity] for e in painted], np.uint8)

    def dense(self) -> np.ndarray:
        """(steps, layers) codes; 1 (healthy) where no event covers a cell."""
        out = np.ones((self.n_steps, self.n_layers), np.uint8)
        for j, a, b, lv in zip(self.layer, self.start, self.stop, self.level):
            np.maximum(out[a:b, j], lv, out=out[a:b, j])
        return out

    def bucketed(self, start: int, stop: int, cols: int) -> np.ndarray:
        """(layers, cols) worst code per bucket of steps [start, stop)."""
        out = np.ones((self.n_layers, cols), np.uint8)
        span = max(stop - start, 1)
        keep = (self.stop > start) & (self.start < stop)
        a = np.clip(self.start[keep], start, stop - 1)
        b = np.clip(self.stop[keep] - 1, start, stop - 1)
        ca = ((a - start) * cols) // span
        cb = ((b - start) * cols) // span
        for j, x, y, lv in zip(self.layer[keep], ca, cb, self.level[keep]):
            np.maximum(out[j, x:y + 1], lv, out=out[j, x:y + 1])
        return out

    def at(self, step: int, layer: int) -> int:
        hit = (self.layer == layer) & (self.start <= step) & (self.stop > step)
        return int(self.level[hit].max()) if hit.any() else 1
