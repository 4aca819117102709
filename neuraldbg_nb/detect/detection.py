"""Detection as a whole: every detector over a trace, whole (`detect`) or step by step
(`Detection`), with the same answer."""

from __future__ import annotations

from collections.abc import Callable

from ..trace.columns import Trace
from . import (
    activations,
    amp,
    data,
    gradients,
    labels,
    loop,
    loss,
    loss_form,
    membership,
    regime,
    updates,
    warmup,
)
from .baseline import BaselineCache
from .events import Event
from .last_update import last_update_events
from .regime import GRADIENT_PATIENCE
from .rootcause import first_failure, symptoms
from .scan import Carry, Finding, scan_all
from .states import StateMap
from .thresholds import Thresholds
from .wake import SampledWake, jump_held, rise_held, wake

Detector = Callable[[Trace, int, int, Thresholds], list[Finding]]


def _recent(th: Thresholds) -> int:
    return th.window + 2


def _trend(th: Thresholds) -> int:
    return th.trend + 2 * th.window + 2  # a level `trend` back, jumps a window before it


DETECTORS: tuple[tuple[Detector, Callable[[Thresholds], int]], ...] = (
    (data.findings, _trend),
    (activations.findings, _recent),
    (regime.activation_findings, _recent),
    (regime.gradient_findings, _recent),
    (updates.findings, _recent),
    (updates.lr_findings, updates.per_batch_history),
    (updates.stall_findings, _recent),
    (warmup.findings, warmup.history),
    (loss.findings, _trend),
    (loss_form.findings, _recent),
    (loss_form.chance_findings, loss_form.chance_history),
    (labels.findings, _recent),
    (gradients.findings, gradients.history),
    (loop.findings, loop.history),
    (membership.findings, _recent),
    (membership.cut_findings, _recent),
    (amp.findings, _recent),
)
"""Each detector with the steps of history before a chunk that it reads."""

_CACHED = (regime.activation_findings, regime.gradient_findings)
"""The detectors that keep their trailing baselines in `Detection.baselines`."""


def history_rows(th: Thresholds) -> int:
    """Steps before a chunk that the detectors read (the longest history any uses)."""
    return max(need(th) for _, need in DETECTORS)


class Detection:
    """Events of a trace so far; `advance` reads the steps recorded since the last call."""

    def __init__(self, thresholds: Thresholds, start: int = 0,
                 kept: list[Event] | None = None,
                 baselines: BaselineCache | None = None) -> None:
        """`start`: the first step to scan (a compacted trace is scanned from its exact
        tail on); `kept`: events of earlier steps carried over as they are; `baselines`:
        a cache shared by the re-classifications of one trace (the events are the same
        without it; a live run, which scans each step once, goes without)."""
        self.thresholds = thresholds
        self.baselines = baselines
        self.kept = list(kept or [])
        self._events: list[Event] = []
        self._last: list[Event] = []  # the run's last update (`last_update`), once it ended
        self._sorted: list[Event] | None = None
        self._carries: dict[tuple[str, str], Carry] = {}
        self.steps_done = start

    def advance(self, trace: Trace) -> list[Event]:
        """Scan the new steps; returns the events that appeared (in step order)."""
        start, stop = self.steps_done, trace.n_steps
        if stop <= start:
            return self._judge_last_update(trace)
        th = self.thresholds
        before = len(self._events)
        names = [(info.name, info.label) for info in trace.layers]
        found_all: list[tuple[Finding, Carry, int]] = []
        for detector, need in DETECTORS:
            lo = max(trace.full_from, start - need(th))
            if detector in _CACHED:  # keeps its trailing baselines in the cache
                found = detector(trace, lo, stop, th, self.baselines)
            else:
                found = detector(trace, lo, stop, th)
            for f in found:
                carry = self._carries.get((f.kind, f.signal))
                if carry is None:  # not setdefault: a Carry is eight arrays to build
                    carry = self._carries[(f.kind, f.signal)] = Carry()
                found_all.append((f, carry, start - lo))
        scan_all(found_all, start, names, th.patience, self._events)
        self.steps_done = stop
        self._sorted = None
        return sorted(self._events[before:] + self._judge_last_update(trace), key=_order)

    def _judge_last_update(self, trace: Trace) -> list[Event]:
        """The events of the run's last update where the trace ended (`last_update`);
        they go, and are judged as any update, once the trace goes on. Returns those new
        since the last call."""
        last = last_update_events(trace, self.thresholds, self._carries, self._events,
                                  _recent(self.thresholds))
        new = [e for e in last if e not in self._last]
        if last != self._last:
            self._last, self._sorted = last, None
        return new

    @property
    def events(self) -> list[Event]:
        """All events so far, in step order (and forward order within a step)."""
        if self._sorted is None:
            self._sorted = sorted(self.kept + self._events + self._last, key=_order)
        return self._sorted

    @property
    def emitted(self) -> list[Event]:
        """All events so far in the order they were found (new ones are appended; an
        event's `end` is filled in place when its state ends)."""
        return self._events


def _order(e: Event) -> tuple[int, int, str]:
    return (e.step, e.order, e.kind)


def keep_baselines(trace: Trace, thresholds: Thresholds, baselines: BaselineCache) -> None:
    """Compute into `baselines` what every re-classification of the trace's exact tail
    shares under the baseline settings of `thresholds` (`window`, `warmup`, `noise`), so
    that the first one is as fast as the next."""
    for detector in _CACHED:
        detector(trace, trace.full_from, trace.n_steps, thresholds, baselines)


def detect(trace: Trace, thresholds: Thresholds | None = None
           ) -> tuple[StateMap, list[Event]]:
    """States and events of a recorded trace under `thresholds`."""
    d = Detection(thresholds or Thresholds(), start=trace.full_from)
    d.advance(trace)
    events = d.events
    return StateMap(events, trace.n_steps, trace.n_layers), events


__all__ = ["DETECTORS", "GRADIENT_PATIENCE", "BaselineCache", "Detection", "SampledWake",
           "StateMap", "detect", "first_failure", "history_rows", "jump_held",
           "keep_baselines", "rise_held", "symptoms", "wake"]
