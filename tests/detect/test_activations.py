"""The activation detector (`detect.activations`) on hand-made traces: dead units are
judged against a band below their line, so a fraction that wanders just under it neither
starts nor ends a condition."""

from __future__ import annotations

import numpy as np
from traces import N, build, of

from neuraldbg_nb.detect import detect


def test_dead_units_just_below_the_threshold_neither_start_nor_end_a_condition():
    d = np.full((N, 1), 0.1)
    d[20:45, 0] = [0.52, 0.47, 0.45, 0.51, 0.43] * 5  # wanders across 0.5, never below 0.4
    d[52:58, 0] = 0.45                                # just below the line, from healthy
    trace = build([("r", "relu")], {"dead_frac": d})  # healthy (0.1) at 45-51 and from 58
    _, events = detect(trace)
    dead = of(events, "dead_units")
    assert [(e.step, e.severity, e.end) for e in dead] == [(20, "warning", 45)]
    assert [e.step for e in of(events, "recovery", "r")] == [45]
