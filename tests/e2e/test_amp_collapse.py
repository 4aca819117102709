"""A GradScaler whose scale collapses, every step skipped, in real trainings (bfloat16
autocast on the CPU): gradients that are NaN whatever the scale (a sqrt whose backward
meets 0, the loss itself finite) make the scaler halve its scale at every iteration and
skip every optimizer step, from the first step or from step 30 on. The collapse is the
first failure, in the step that holds those iterations; the same training without the
fault is quiet.

Needs the step row to hold the scales (`Backwards.scales`, read at the boundary) and, for
the collapse after step 30, the iterations after the last optimizer step closed as a step
at exit."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from loops import assert_no_errors
from models import mlp

import neuraldbg_nb as ndbg

ITERATIONS = 130


def _amp(fault_from: int | None) -> tuple[ndbg.Run, torch.amp.GradScaler]:
    setup = mlp()
    model = setup.model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    with ndbg.watch(model, report=False) as run:
        for step in range(ITERATIONS):
            x, y = setup.batch(step)
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
                loss = F.cross_entropy(out, y)
            if fault_from is not None and step >= fault_from:  # 0 forward, NaN backward
                loss = loss + torch.sqrt((out.float() - out.float().detach()).pow(2).sum())
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    return run, scaler


def test_a_scale_that_collapses_from_the_first_step_is_the_first_failure():
    run, scaler = _amp(0)
    assert scaler.get_scale() < 1e-30
    ff = run.first_failure
    assert (ff.kind, ff.signal, ff.layer, ff.step) == (
        "nonfinite_gradient", "loss_scale", None, 0), ff
    assert f"fell from 6.55e+04 to 9.63e-35 over {ITERATIONS} iterations" in ff.message
    assert "every step was skipped" in ff.message
    assert any("the GradScaler skipped every one" in n for n in run.notes), run.notes


def test_a_scale_that_collapses_after_30_good_steps_is_found_at_exit():
    run, _ = _amp(30)
    ff = run.first_failure
    assert (ff.signal, ff.step) == ("loss_scale", 30), ff
    assert f"over {ITERATIONS - 30} iterations" in ff.message


def test_the_same_training_without_the_fault_is_quiet():
    run, scaler = _amp(None)
    assert scaler.get_scale() == 65536.0
    assert_no_errors(run)
    assert run.first_failure is None
