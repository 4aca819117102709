"""The run's last update is judged like any other: its weights' norms are read as the watch
ends (`Trace.ended`), and the update detectors read them as the step after would
(`detect.last_update`). A learning rate set 1000x at the last step is an exploding update
of that step, named with its learning rate; the healthy run stays quiet, a saved run says
the same, and a watch entered again judges that update at its next step instead."""

from __future__ import annotations

import torch
from loops import assert_no_errors, relu_mlp, task_loop

import neuraldbg_nb as ndbg

STEPS = 40


def _raise_lr_at(at: int):
    def on_step_start(step, model, opt):
        if step == at:
            for group in opt.param_groups:
                group["lr"] *= 1000
    return on_step_start


def _run(steps: int = STEPS, at: int | None = STEPS - 1):
    model = relu_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with ndbg.watch(model, report=False) as run:
        task_loop(model, steps, opt=opt,
                  on_step_start=None if at is None else _raise_lr_at(at))
    return run, model, opt


def test_an_update_that_blows_up_at_the_last_step_is_the_first_failure(tmp_path):
    run, _, _ = _run()
    first = run.first_failure
    assert first is not None, [str(e) for e in run.events]
    assert (first.kind, first.step, first.severity) == ("exploding_update", STEPS - 1, "error")
    assert "0.05 -> 50" in first.message, first.message
    saved = ndbg.load(run.save(tmp_path / "run.npz"))
    assert (saved.first_failure.kind, saved.first_failure.step) == ("exploding_update", STEPS - 1)
    again = run.reclassify(max_update=1e6)  # (only non-finite weights would count)
    assert not [e for e in again.events if e.kind == "exploding_update"]


def test_a_healthy_run_ends_quiet():
    run, _, _ = _run(at=None)
    assert run.trace.ended
    assert_no_errors(run)
    assert not [e for e in run.events if e.kind == "exploding_update"]


def test_a_watch_entered_again_judges_the_last_update_at_its_next_step():
    """The update at the block's last step is judged once: as the step after it would,
    while the run has ended, and by that step once a second block records it."""
    model = relu_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    watch = ndbg.watch(model, report=False)
    with watch as run:
        task_loop(model, 20, opt=opt, on_step_start=_raise_lr_at(19))
    first = [(e.kind, e.layer, e.step) for e in run.events if e.kind == "exploding_update"]
    assert first and all(step == 19 for _, _, step in first), first
    with watch:
        task_loop(model, 5, opt=opt)
    assert run.trace.n_steps == 25 and run.trace.ended
    later = [(e.kind, e.layer, e.step) for e in run.events if e.kind == "exploding_update"
             and e.step == 19]
    assert later == first, (later, first)
