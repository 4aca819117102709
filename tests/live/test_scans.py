"""The live run's scan schedule (`live.scans.ScanSchedule`) on hand-made traces: a loss
rise or a gradient jump that held is scanned for at the step that confirms it, a blip is
not."""

from __future__ import annotations

import numpy as np
from traces import build, noisy, of

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import Detection, detect
from neuraldbg_nb.live.scans import ScanSchedule


def test_the_scan_schedule_confirms_a_rise_that_held_and_not_a_blip() -> None:
    """A loss 20x up for one step wakes no second scan `patience` steps later; one that
    stays up does, at that step (its divergence is reported there)."""
    th = ndbg.Thresholds()
    for length, scans_then in ((1, False), (5, True)):
        loss = np.full(40, 0.5)
        loss[30:30 + length] = 10.0
        cols = {"grad_norm": np.full((40, 1), 0.1), "act_absmax": np.ones((40, 1))}
        schedule, det = ScanSchedule(th), Detection(th)
        schedule.interval = 1000  # no batch scan: only the schedule's reasons count
        due = {}
        for k in range(1, 40):
            det.steps_done = k - 1  # the newest step pending
            due[k - 1] = schedule.due(build([("a", "other")], cols, {"loss": loss}, n=k), det)
        assert due[30] is False, "a rise is not a sudden event"
        assert due[30 + th.patience] is scans_then, length


def test_the_scan_schedule_confirms_a_gradient_jump_that_held_at_its_second_step() -> None:
    """A gradient 30x up for one step wakes no scan (its regime shift needs two steps);
    one that stays up wakes one at its second step, which reports it there."""
    th = ndbg.Thresholds()
    for length, scans_then in ((1, False), (5, True)):
        grad = noisy(0.1, n=40)
        grad[30:30 + length] *= 30.0
        cols = {"grad_norm": grad, "act_absmax": np.ones((40, 1))}
        scalars = {"loss": np.ones(40)}
        schedule, det = ScanSchedule(th), Detection(th)
        schedule.interval = 1000  # no batch scan: only the schedule's reasons count
        due = {}
        for k in range(1, 40):
            det.steps_done = k - 1  # the newest step pending
            due[k - 1] = schedule.due(build([("a", "other")], cols, scalars, n=k), det)
        assert due[30] is False, "a gradient's jump alone is not a sudden event"
        assert due[31] is scans_then, length
        if scans_then:
            _, events = detect(build([("a", "other")], cols, scalars, n=32), th)
            assert [e.step for e in of(events, "regime_shift", signal="gradient")] == [30]


def test_a_view_is_scanned_for_as_often_as_scans_stay_within_its_budget() -> None:
    """Scans for a view come every `VIEW_LATENCY` seconds where they are cheap, less often
    where that would cost more than `VIEW_BUDGET` of the time (a deep model's scan), and
    at least every `VIEW_MAX_LATENCY` seconds however long a scan takes."""
    schedule = ScanSchedule(ndbg.Thresholds())
    assert schedule.view_latency == ScanSchedule.VIEW_LATENCY  # nothing scanned yet
    for cost, latency in ((0.0002, ScanSchedule.VIEW_LATENCY), (0.008, 0.8), (0.5, 1.0)):
        schedule.scanned(cost)
        assert np.isclose(schedule.view_latency, latency), cost
        assert cost / schedule.view_latency <= ScanSchedule.VIEW_BUDGET or latency == 1.0


def test_a_dead_fraction_crossing_is_scanned_for_only_where_the_run_stops_at_errors() -> None:
    """A ReLU layer's dead fraction crossing its line at a sampled step is scanned for
    `patience` steps later where the run stops at its first error, so that it stops soon
    after; otherwise the layer is still named for capture at that step (`woken`), and the
    batch scans find its event."""
    th = ndbg.Thresholds()
    dead = np.full((40, 1), np.nan)
    dead[0:40:10] = 0.1
    dead[30] = 0.9  # crosses at the sampled step 30
    sampled = np.zeros(40)
    sampled[0:40:10] = 1.0
    cols = {"grad_norm": np.full((40, 1), 0.1), "dead_frac": dead}
    scalars = {"loss": np.full(40, 0.5), "sampled": sampled}
    for stops in (True, False):
        schedule, det = ScanSchedule(th, stops=stops), Detection(th)
        schedule.interval = 1000  # no batch scan: only the schedule's reasons count
        due, woken = {}, {}
        for k in range(1, 40):
            det.steps_done = k - 1  # the newest step pending
            due[k - 1] = schedule.due(build([("relu", "relu")], cols, scalars, n=k), det)
            woken[k - 1] = schedule.woken
        assert woken[30] == [0], stops
        assert due[30 + th.patience] is stops, stops
