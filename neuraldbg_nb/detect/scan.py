"""From per-step condition codes to events: the one state machine all detectors share.

A detector says, for each step and layer, how bad things are (a code); this module turns
those codes into events on transitions, with hysteresis: a condition is reported when it
has held for `patience` steps (at the step it started), and ends only after `exit_patience`
healthy steps, so a value hovering at a threshold gives one event, not one per step.

The machine is a sequential scan, carried across chunks: scanning a trace in one piece or
step by step during a live run gives the same events. Only columns whose codes change
are walked in Python; a healthy column costs a few vectorised numpy ops per chunk.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from .events import Event

HOLD, OK, INFO, WARNING, ERROR = -1, 0, 1, 2, 3
"""Codes: HOLD means "not observed at this step, keep the last code"."""
SEVERITY = {INFO: "info", WARNING: "warning", ERROR: "error"}

Message = Callable[[str, int, float, float, str], str]
"""(name, step, value, previous, severity) -> one sentence with the numbers."""


@dataclass(frozen=True)
class Finding:
    """A detector's verdict on a block of rows, for one kind of event."""

    kind: str
    signal: str
    codes: np.ndarray
    """(rows, columns) int8 codes; one column per layer, or one for the data/loss."""
    values: np.ndarray
    """(rows, columns) the number the event reports."""
    message: Message
    recovery: Message | None = None
    """Sentence for the end of the condition; None: its end is not an event."""
    previous: np.ndarray | None = None
    """(rows, columns) the level the value came from; None: the last healthy value."""
    per_layer: bool = True
    patience: int = 1
    hold_counts: bool = True
    """Whether steps coded HOLD count towards `patience` while a condition waits to be
    reported. True for values measured on sampled steps only, where HOLD is "not
    measured" and one sample stands for the steps around it. False where HOLD is a band
    of values that keeps a reported condition but is no evidence of it (a vanished
    gradient's recovery band): a zero-initialised branch's gradient, 0 at its first step
    and then climbing through the band, would otherwise be three steps of "vanishing"."""
    sticky: bool = False
    """Never leaves its state once entered (non-finite values are never a recovery)."""
    step_offset: int = 0
    """Added to the row to get the event's step (a weight change seen at row t happened in
    the update of step t-1)."""
    began: Callable[[int, int], int] | None = None
    """(column, step first seen) -> the step the condition began, at most the step seen:
    where it is read on sampled steps only but a number of every step dates it (a
    learning rate brought to about 0 between two samples). None: the step seen."""


@dataclass
class Carry:
    """Per-column machine state between chunks."""

    level: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    code: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    length: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Rows of the current code's run where it was observed, not held (`hold_counts`)."""
    start_value: np.ndarray = field(default_factory=lambda: np.zeros(0))
    start_previous: np.ndarray = field(default_factory=lambda: np.zeros(0))
    last_ok: np.ndarray = field(default_factory=lambda: np.zeros(0))
    open: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def grow(self, columns: int) -> None:
        extra = columns - len(self.level)
        if extra <= 0:
            return
        for name, value in _FILL.items():
            old = getattr(self, name)
            new = np.full(extra, value, old.dtype)
            setattr(self, name, np.concatenate([old, new]) if len(old) else new)


_FILL = {"level": 0, "code": 0, "start": 0, "length": 0, "seen": 0, "start_value": np.nan,
         "start_previous": np.nan, "last_ok": np.nan, "open": -1}
"""Each `Carry` array's value for a column not scanned yet."""


def grade(observed: np.ndarray, *levels: tuple[np.ndarray, int]) -> np.ndarray:
    """Codes from masks: HOLD where not `observed`; elsewhere the code of the last of
    `levels` (mask, code) whose mask holds there, OK where none does."""
    codes = observed.view(np.int8) - np.int8(1)
    for mask, code in levels:
        np.copyto(codes, np.int8(code), where=mask & observed)
    return codes


def forward_fill(codes: np.ndarray, initial: np.ndarray) -> np.ndarray:
    """Replace HOLD by the last observed code above it (or `initial` for leading HOLDs)."""
    n, c = codes.shape
    rows = np.where(codes >= 0, np.arange(n, dtype=np.int32)[:, None], np.int32(-1))
    np.maximum.accumulate(rows, axis=0, out=rows)
    picked = codes[np.maximum(rows, 0), np.arange(c)[None, :]]
    return np.where(rows >= 0, picked, initial[None, :]).astype(np.int8)


def last_ok_rows(codes: np.ndarray, values: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """For each of the columns `cols` (sorted, unique), the last row whose value was
    observed healthy (code OK, value not NaN), or -1. Searched backwards in growing blocks,
    so a column healthy at its last row costs one cell, not a pass over the chunk."""
    n = len(codes)
    if n <= 64:  # a live chunk: one pass (over every column: no copy to pick them)
        every = len(cols) == codes.shape[1]
        ok = (codes if every else codes[:, cols]) == OK
        ok &= ~np.isnan(values if every else values[:, cols])
        return np.where(ok.any(0), n - 1 - np.argmax(ok[::-1], axis=0), -1)
    row = np.full(len(cols), -1, np.int64)
    todo = np.arange(len(cols))
    hi, size, pruned = n, 1, False
    while len(todo) and hi > 0:
        c = cols[todo]
        if size > 64 and not pruned:  # not in the last rows: skip the never-healthy columns
            pruned = True
            rest = codes[:hi] if len(c) == codes.shape[1] else codes[:hi, c]
            todo = todo[(rest == OK).any(0)]
            continue
        lo = max(hi - size, 0)
        ok = (codes[lo:hi, c] == OK) & ~np.isnan(values[lo:hi, c])
        found = ok.any(0)
        row[todo[found]] = (hi - 1 - np.argmax(ok[::-1], axis=0))[found]
        todo = todo[~found]
        hi, size = lo, size * 8
    return row


def scan(f: Finding, carry: Carry, first_step: int, names: list[tuple[str, str]],
         exit_patience: int, events: list[Event], skip: int = 0) -> None:
    """Advance the machine over the rows of `f` from row `skip` on (the rows before are
    history the detector read; row `skip` is step `first_step`), appending new events to
    `events` and closing the ones that ended (their `end` is set). `names` holds each
    column's (qualified name, label for sentences)."""
    codes, values = f.codes[skip:], f.values[skip:]
    previous = None if f.previous is None else f.previous[skip:]
    n, cols = codes.shape
    if n == 0:
        return
    carry.grow(cols)
    level = carry.level[:cols]
    if 0 < cols and n <= SHORTCUT_ROWS and codes.max() <= OK and not level.any() \
            and not carry.code[:cols].any():
        _healthy(codes, values, carry)  # (the usual live chunk: the steady case, in fewer ops)
        return
    # steady: every observed code equals the reported level, and nothing is pending
    steady = ((codes == level[None, :]) | (codes == HOLD)).all(0) & (carry.code[:cols] == level)

    # steady columns: the run goes on; only the last healthy value can change
    quiet = np.flatnonzero(steady)
    carry.length[quiet] += n  # (`seen` matters only while a code waits to be reported)
    row = last_ok_rows(codes, values, quiet)
    has = row >= 0
    carry.last_ok[quiet[has]] = values[row[has], quiet[has]]

    moving = np.flatnonzero(~steady)
    if len(moving):
        filled = np.ascontiguousarray(forward_fill(codes[:, moving], carry.code[moving]).T)
        for i, j in enumerate(moving.tolist()):
            _walk(f, codes, values, previous, carry, j, filled[i], first_step, names,
                  exit_patience, events)


SHORTCUT_ROWS = 64
"""Chunks of at most this many rows that are healthy throughout (`_healthy`) take a
shortcut: a few whole-chunk ops instead of the general walk's, about a sixth of a live
scan's time. Longer ones (a whole trace judged again) take the general walk, which reads
only the last rows of a healthy column."""


def scan_all(found: list[tuple[Finding, Carry, int]], first_step: int,
             names: list[tuple[str, str]], exit_patience: int, events: list[Event]) -> None:
    """`scan` of each (finding, its carry, skip) of one chunk, in their order. The
    findings healthy throughout a short chunk (`SHORTCUT_ROWS`), with nothing reported or
    pending in any of their columns, the usual ones of a live scan, are told apart and
    go on together: their codes and values side by side, the test and the last healthy
    values are a few ops for all of them instead of a few for each (a scan reads some
    fifty findings). They add no event; the others take `scan`."""
    rows = [f.codes.shape[0] - skip for f, _, skip in found]
    n = Counter(rows).most_common(1)[0][0] if rows else 0  # the chunk's rows
    carries = Counter(id(c) for _, c, _ in found)  # (a carry two findings share: in turn)
    batched = [0 < r == n <= SHORTCUT_ROWS and f.codes.shape[1] > 0 and carries[id(c)] == 1
               for r, (f, c, _) in zip(rows, found)]
    healthy = [False] * len(found)
    if any(batched):
        together = [q for q, b in zip(found, batched) if b]
        widths = [f.codes.shape[1] for f, _, _ in together]
        for (_, carry, _), w in zip(together, widths):
            carry.grow(w)
        at = np.cumsum([0, *widths])
        codes = np.concatenate([f.codes[skip:] for f, _, skip in together], axis=1)
        values = np.concatenate([f.values[skip:] for f, _, skip in together], axis=1)
        pending = np.concatenate([c.level[:w] | c.code[:w]
                                  for (_, c, _), w in zip(together, widths)])
        moving = np.logical_or.reduceat((codes.max(0) > OK) | (pending != 0), at[:-1])
        every = np.arange(codes.shape[1])
        row = last_ok_rows(codes, values, every)
        has = row >= 0
        last = values[np.maximum(row, 0), every]
        k = 0
        for i, b in enumerate(batched):
            if not b:
                continue
            if not moving[k]:
                healthy[i] = True
                carry, lo, hi = found[i][1], at[k], at[k + 1]
                carry.length[:hi - lo] += n
                np.copyto(carry.last_ok[:hi - lo], last[lo:hi], where=has[lo:hi])
            k += 1
    for (f, carry, skip), done in zip(found, healthy):
        if not done:
            scan(f, carry, first_step, names, exit_patience, events, skip)


def _healthy(codes: np.ndarray, values: np.ndarray, carry: Carry) -> None:
    """`scan` of a chunk whose codes are all OK or HOLD, with nothing reported or pending
    in any column: each column's run goes on, and its last healthy value is its last
    observed one."""
    n, cols = codes.shape
    carry.length[:cols] += n
    every = np.arange(cols)
    row = last_ok_rows(codes, values, every)
    has = row >= 0
    carry.last_ok[every[has]] = values[row[has], every[has]]


def _walk(f: Finding, codes: np.ndarray, values: np.ndarray, previous: np.ndarray | None,
          carry: Carry, j: int, col: np.ndarray, first_step: int,
          names: list[tuple[str, str]], exit_patience: int, events: list[Event]) -> None:
    own = values[:, j]
    bounds = np.flatnonzero(np.diff(col)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(col)]])
    name, label = names[j] if f.per_layer else (None, "")
    observed = None if f.hold_counts else np.cumsum(codes[:, j] != HOLD)
    for a, b in zip(starts.tolist(), ends.tolist()):
        k = int(col[a])
        seen = 0 if observed is None else \
            int(observed[b - 1]) - (int(observed[a - 1]) if a else 0)
        if a == 0 and k == carry.code[j]:
            carry.length[j] += b - a
            carry.seen[j] += seen
        else:
            carry.code[j], carry.start[j], carry.length[j] = k, first_step + a, b - a
            carry.seen[j] = seen
            carry.start_value[j] = own[a]
            carry.start_previous[j] = (previous[a, j] if previous is not None
                                       else _before(events, carry, j))
        level = int(carry.level[j])
        held = carry.length[j] if f.hold_counts else carry.seen[j]
        if k > level and held >= f.patience:
            seen_at = int(carry.start[j]) + f.step_offset
            _close(events, carry, j, seen_at)
            at = seen_at if f.began is None else min(seen_at, f.began(j, seen_at))
            events.append(_event(f, name, label, j, k, at, float(carry.start_value[j]),
                                 float(carry.start_previous[j])))
            carry.open[j] = len(events) - 1
            carry.level[j] = k
        elif k == OK < level and not f.sticky and carry.length[j] >= exit_patience:
            at = int(carry.start[j]) + f.step_offset
            failed = events[carry.open[j]].value if carry.open[j] >= 0 else np.nan
            _close(events, carry, j, at)
            carry.level[j] = OK
            if f.recovery is not None:
                value = float(carry.start_value[j])
                events.append(Event(at, name, "recovery", "info",
                                    f.recovery(label, at, value, failed, "info"),
                                    value, failed, f.signal, at, j if f.per_layer else -1))
        if k == OK:  # the last healthy value: most often the segment's last row
            last = b - 1 if codes[b - 1, j] == OK and not np.isnan(own[b - 1]) else \
                a + int(last_ok_rows(codes[a:b], values[a:b], np.array([j]))[0])
            if last >= a:
                carry.last_ok[j] = own[last]


def _before(events: list[Event], carry: Carry, j: int) -> float:
    """What a new condition of column j was before it: the last healthy value, or, where
    it goes on from a milder one still open (a warning becoming an error), the value
    that one was reported with. Units 55% dead from step 110 and 80% from step 250 would
    read "80% ... from step 250, was 0%" with the healthy value, as if they had died at
    once."""
    i = int(carry.open[j])
    return events[i].value if i >= 0 and carry.level[j] > OK else float(carry.last_ok[j])


def _close(events: list[Event], carry: Carry, j: int, at: int) -> None:
    i = int(carry.open[j])
    if i >= 0:
        events[i] = replace(events[i], end=at)
        carry.open[j] = -1


def _event(f: Finding, name: str | None, label: str, j: int, code: int, step: int,
           value: float, previous: float) -> Event:
    severity = SEVERITY[code]
    return Event(step=step, layer=name, kind=f.kind, severity=severity,
                 message=f.message(label, step, value, previous, severity),
                 value=value, previous=previous, signal=f.signal,
                 order=j if f.per_layer else -1)


def fmt(x: float) -> str:
    """A number for a sentence: 3 significant digits, words for the non-finite."""
    if math.isnan(x):
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return f"{x:.3g}"
