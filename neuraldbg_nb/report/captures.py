"""Tensors kept for inspection, under a memory budget that is never exceeded.

Captures are CPU copies of a layer's input, output, parameters and gradients (and the
input batch) taken when a detector fires and at sparse reference steps (0, 1, 2, 4, 8,
...) so an event can be shown beside the last healthy state. References only fill free
room; when the budget is full, an event capture pushes out references first (oldest
first), then later event captures; the earliest event capture is the last to go. A tensor
larger than a quarter of the budget is kept as an evenly strided sample and marked so.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch

REFERENCE = "reference"
EVENT = "event"


@dataclass(frozen=True)
class Capture:
    """The tensors of one layer (or of the batch: layer None) at one step."""

    step: int
    layer: str | None
    reason: str
    tensors: dict[str, torch.Tensor]
    sampled: frozenset[str] = field(default_factory=frozenset)
    """Names of tensors kept as a strided sample (too large for the budget)."""
    note: str = ""

    @property
    def nbytes(self) -> int:
        """Bytes held; a tensor kept under two names (`grad` and `weight.grad`) once."""
        unique = {id(t): t for t in self.tensors.values()}
        return sum(t.numel() * t.element_size() for t in unique.values())

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            why = (" (on the CPU a large activation is held for capture only where its "
                   "layer's forward looked unusual at that step, or on sampled and "
                   "reference steps)") if name in ("input", "output") else ""
            raise KeyError(f"no tensor {name!r} in this capture{why}; it has: "
                           f"{', '.join(self.tensors) or 'nothing'}") from None


REFERENCE_BYTES = 1 << 16
"""Bytes kept of each tensor of a reference capture: a strided sample of larger ones
(named in `Capture.sampled`). References are there to be compared with an event's
capture (the inspector's histograms beside the last healthy step) and 16K values draw
the same histogram as millions. Whole, a reference step of an MLP 8x512 (every weight,
gradient, input and output: 18 MB) costs about 20 ms, 0.5 ms a step over its first 150
steps; sampled, about 5 ms. Event captures keep whole tensors."""


class Captures:
    """The captures of one run by step and layer, within a byte budget; what a `Run` reads
    (`find`, `last_healthy`). A live run's are taken by `live.captures.CaptureStore`; a
    loaded run has none."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"capture budget must be >= 0 bytes, got {budget_bytes}")
        self.budget = budget_bytes
        self._items: dict[tuple[int, str | None], Capture] = {}
        self.nbytes = 0
        self.dropped = 0
        """Captures that could not be kept within the budget."""

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Capture]:
        return iter(sorted(self._items.values(), key=lambda c: (c.step, c.layer or "")))

    def has(self, step: int, layer: str | None) -> bool:
        return (step, layer) in self._items

    def find(self, step: int, layer: str | None) -> Capture | None:
        """The capture of `layer` at `step`, else the nearest one of that layer, with a
        note saying so; None if the layer was never captured."""
        exact = self._items.get((step, layer))
        if exact is not None:
            return exact
        same = [c for c in self._items.values() if c.layer == layer]
        if not same:
            return None
        near = min(same, key=lambda c: (abs(c.step - step), -c.step))
        return replace(near, note=f"nothing was captured for {layer or 'the batch'} at step "
                                  f"{step}; this is the nearest capture, step {near.step}")

    def last_healthy(self, step: int, layer: str | None) -> Capture | None:
        """The latest reference capture of `layer` before `step`."""
        before = [c for c in self._items.values()
                  if c.layer == layer and c.reason == REFERENCE and c.step < step]
        return max(before, key=lambda c: c.step) if before else None
