"""A Run only reads: its events are what its watch's detection found. The watch judges the
run: at its scan schedule's pace while the block runs (a view's pace while one follows
it), before it stops the training, and every recorded step when the block ends."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
from models import mlp, train

import neuraldbg_nb as ndbg
from neuraldbg_nb.live import watcher
from neuraldbg_nb.live.captures import CaptureStore
from neuraldbg_nb.live.scans import ScanSchedule

FAULT = 30


def _nan_batch(step: int, x: torch.Tensor) -> torch.Tensor:
    return x * math.nan if step == FAULT else x


def _judged_whole(run: ndbg.Run) -> list[tuple]:
    """The run's trace judged again in one go, under its thresholds."""
    fresh = ndbg.Run(run.trace, run.thresholds, CaptureStore(0))
    return [(e.kind, e.layer, e.step, e.end) for e in fresh.events]


def test_reading_a_live_runs_events_does_no_detection_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the block, with steps the schedule has not scanned yet: every read leaves
    detection where the watch left it, and gives the same answer twice."""
    monkeypatch.setattr(ScanSchedule, "MAX_LATENCY", math.inf)  # scans by the budget only
    setup = mlp()
    opt = setup.make_opt(setup.model)
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 40, opt=opt)
        done = run.detection.steps_done
        assert done < run.trace.n_steps, "no step is left to judge: the test cannot fail"
        first = list(run.events)
        reads = (run.events, run.first_failure, run.symptoms, run.likely_causes,
                 run.states, repr(run), str(run))
        assert reads is not None
        assert run.detection.steps_done == done
        assert run.events == first
    assert run.detection.steps_done == run.trace.n_steps == 40


@pytest.mark.parametrize("ending", ["normal", "exception", "interrupt"])
def test_every_recorded_step_is_judged_when_the_block_ends(
        monkeypatch: pytest.MonkeyPatch, ending: str) -> None:
    monkeypatch.setattr(ScanSchedule, "MAX_LATENCY", math.inf)
    setup = mlp()

    def end(step, model, opt):
        if step == FAULT + 5 and ending == "exception":
            raise ValueError("the loop's own error")
        if step == FAULT + 5 and ending == "interrupt":
            raise KeyboardInterrupt

    raised = {"exception": ValueError, "interrupt": KeyboardInterrupt}.get(ending)
    with pytest.raises(raised) if raised else contextlib.nullcontext(), \
            ndbg.watch(setup.model, report=False) as run:
        train(setup, 50, on_batch=_nan_batch, on_step_start=end)
    assert run.detection.steps_done == run.trace.n_steps
    assert run.first_failure is not None and run.first_failure.step == FAULT
    assert [(e.kind, e.layer, e.step, e.end) for e in run.events] == _judged_whole(run)


def test_a_view_sees_the_run_judged_at_its_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a listener, the watch scans at the view's pace (here: at every step); without
    one, it leaves steps to its budget. Reading the run from the listener judges
    nothing."""
    monkeypatch.setattr(ScanSchedule, "MAX_LATENCY", math.inf)
    monkeypatch.setattr(ScanSchedule, "VIEW_LATENCY", 0.0)
    monkeypatch.setattr(ScanSchedule, "VIEW_BUDGET", math.inf)
    setup = mlp()
    opt = setup.make_opt(setup.model)
    seen: list[tuple[int, int, int]] = []

    def view(run: ndbg.Run, new: list) -> None:
        done = run.detection.steps_done
        assert run.events is run.events and run.first_failure is None  # plain reads
        seen.append((run.trace.n_steps, done, run.detection.steps_done))

    with ndbg.watch(setup.model, report=False) as run:
        unsubscribe = run.subscribe(view)
        train(setup, 40, opt=opt)
        unsubscribe()
        train(setup, 40, opt=opt)
        assert run.detection.steps_done < run.trace.n_steps, "without a view, fewer scans"
    assert len(seen) == 40
    assert all(n == done == after for n, done, after in seen), seen


def test_a_healthy_short_run_is_scanned_at_its_first_step_and_its_end_a_failure_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step is scanned on its own, and the batches are sized from that scan at
    the next step, which pays none (`ScanSchedule.interval`): a short healthy run is
    judged at its first step and when its block ends; a failure at its first or second
    step is scanned for at once, and stops the training there."""
    monkeypatch.setattr(ScanSchedule, "MAX_LATENCY", math.inf)
    scanned: list[int] = []
    scan = watcher.Watch._scan

    def counted(self: watcher.Watch) -> None:
        scanned.append(self.run.trace.n_steps)
        scan(self)

    monkeypatch.setattr(watcher.Watch, "_scan", counted)
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 30)
    assert scanned == [1, 30] and run.first_failure is None, scanned

    for fault in (0, 1):
        scanned.clear()
        setup = mlp()
        with pytest.raises(ndbg.TrainingFailure), \
                ndbg.watch(setup.model, stop_on="error", report=False) as run:
            train(setup, 30, on_batch=lambda step, x, at=fault: x * math.nan if step == at else x)
        assert scanned[-1] == fault + 1 == run.trace.n_steps, (fault, scanned)
        assert run.first_failure is not None and run.first_failure.step == fault


def test_stop_on_error_raises_with_every_step_judged() -> None:
    setup = mlp()
    with pytest.raises(ndbg.TrainingFailure) as raised, \
            ndbg.watch(setup.model, stop_on="error", report=False) as run:
        train(setup, 50, on_batch=_nan_batch)
    assert run.trace.n_steps == FAULT + 1
    assert f"training stopped at step {FAULT}" in str(raised.value)
    assert raised.value.run.first_failure.step == FAULT


def test_a_file_saved_without_its_events_is_judged_when_loaded(tmp_path) -> None:
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 50, on_batch=_nan_batch)
    path = run.save(tmp_path / "run")
    meta = json.loads(path.with_suffix(".json").read_text())
    del meta["events"]
    path.with_suffix(".json").write_text(json.dumps(meta))
    loaded = ndbg.load(path)
    assert loaded.detection.steps_done == loaded.trace.n_steps == 50
    assert [(e.kind, e.layer, e.step) for e in loaded.events] == \
        [(e.kind, e.layer, e.step) for e in run.events]


def test_a_view_hands_its_reclassified_run_on_as_the_last_run() -> None:
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 20)
    assert ndbg.last_run() is run
    shown = run.reclassify(jump=50)
    watcher.replace_last_run(run, shown)
    assert ndbg.last_run() is shown
    watcher.replace_last_run(run, run.reclassify(jump=60))  # `run` is not the last any more
    assert ndbg.last_run() is shown
