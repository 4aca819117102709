"""What a step of the run is: an optimizer step. Evaluation passes inside the loop are left
out (and a block that only evaluates says why nothing was recorded), a replaced optimizer
keeps the steps counted, a model checkpointed whole records its recomputation, steps given
a closure (and L-BFGS's) are recorded as steps without one, and a loop that optimises the
model's input is watched step by step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loops import (
    STEPS,
    S,
    assert_no_errors,
    relu_mlp,
    scale_weight_at,
    setup_loop,
    task_batches,
    task_loop,
)
from models import measured, mlp
from torch import nn

import neuraldbg_nb as ndbg


def test_evaluation_passes_inside_the_loop_are_left_out():
    """An evaluation every few steps (eval mode, no_grad or inference_mode) on a
    validation set unlike the training set, ten times its scale and with a NaN in one
    batch, trains nothing: the run records exactly what the same training records
    without it. Joined to the next training step's, its batches and activations would
    read as a jump of every layer, then a non-finite error, at healthy training steps."""
    x, _ = task_batches(1)
    val = x[:8] * 10
    val[3, 0, 0] = math.nan

    def evaluate(step, m, opt):
        if step % 4 == 3:
            m.eval()
            with torch.no_grad():
                m(val[step // 4])
            with torch.inference_mode():  # inference tensors have no version counter
                m(val[step // 4 + 1])
            m.train()

    runs = []
    for on_step_start in (None, evaluate):
        model = relu_mlp()
        with ndbg.watch(model, report=False) as run:
            losses = task_loop(model, 24, on_step_start=on_step_start)
        runs.append((run, torch.stack(losses)))
    (plain, plain_losses), (evaluated, losses) = runs
    assert torch.equal(losses, plain_losses)
    assert evaluated.trace.layer_names == plain.trace.layer_names
    for col in ("act_absmax", "act_mean", "grad_norm"):
        np.testing.assert_array_equal(evaluated.trace.col(col), plain.trace.col(col))
    for col in ("in_absmax", "in_nonfinite", "in_mean"):
        np.testing.assert_array_equal(evaluated.trace.scalar(col), plain.trace.scalar(col))
    assert [str(e) for e in evaluated.events] == [str(e) for e in plain.events]
    assert_no_errors(evaluated)
    assert evaluated.notes == []


def test_a_block_that_only_evaluates_says_why_no_activations_were_recorded():
    model = relu_mlp()
    x, _ = task_batches(1)
    with ndbg.watch(model, report=False) as run, torch.no_grad():
        for step in range(3):
            model(x[step])
            run.step()
    assert run.trace.n_steps == 3
    assert np.isnan(run.trace.col("act_absmax")).all()
    (note,) = run.notes
    assert "gradients off" in note and "no activations were recorded" in note


def test_a_replaced_optimizer_keeps_the_steps_counted():
    """A notebook re-runs the cell that makes the optimizer: the old one is gone, the new
    one's steps are the run's steps, and a fault after the switch is found there."""
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        setup_loop(setup, 20)  # its optimizer is freed when the loop returns
        setup_loop(setup, 40, on_step_start=scale_weight_at(setup.model, setup.layers["mid"], 25))
    assert run.trace.n_steps == 60
    assert np.isfinite(run.trace.scalar("loss")).all()
    ff = run.first_failure
    assert (ff.step, ff.layer) == (45, setup.layers["mid"])


def test_checkpointing_a_whole_model_records_its_recomputation():
    """Reentrant checkpointing of the whole model calls it first with gradients off (left
    out, as an evaluation) and again in the backward, with them: that call is recorded,
    its batch included."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    x, y = task_batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            batch = x[step] * (1000 if step == S else 1)
            opt.zero_grad()
            out = torch.utils.checkpoint.checkpoint(model, batch.requires_grad_(),
                                                    use_reentrant=True)
            F.cross_entropy(out, y[step]).backward()
            opt.step()
    assert run.trace.layer_names == ["0", "1", "2"]
    assert not np.isnan(measured(run)).any()
    assert np.isfinite(run.trace.scalar("in_absmax")).all()
    first = run.first_failure
    assert first is not None and (first.step, first.kind) == (S, "data_anomaly"), first


def _closure_run(setup, opt, *, closure: bool, fault: int | None = None,
                 keyword: bool = False):
    """`setup` trained with `opt.step(closure)` (forward and backward inside the step;
    `keyword`: `step(closure=...)`) or the usual way; the batch of
    step `fault` is scaled by 1000."""
    model = setup.model
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            x, y = setup.batch(step)
            if step == fault:
                x = x * 1000

            def forward_backward(x=x, y=y):
                opt.zero_grad()
                loss = setup.loss_fn(model(x), y)
                loss.backward()
                return loss

            if closure and keyword:
                opt.step(closure=forward_backward)
            elif closure:
                opt.step(forward_backward)
            else:
                forward_backward()
                opt.step()
    return run


@pytest.mark.parametrize("keyword", [False, True])
def test_steps_given_a_closure_are_recorded_as_steps_without_one(keyword):
    """A closure runs the step's forward and backward after the step's pre-hook; the step
    closes when it returns, before the update, so each row holds its own step (not the
    step before it, which would leave the first row without a loss and find a bad batch
    one step late), and the step is recorded as one without a closure: hooked at the same
    steps, its faults replayed, its weights read for edits before the update."""
    runs = []
    for closure in (False, True):
        setup = mlp()
        opt = torch.optim.SGD(setup.model.parameters(), lr=0.05, momentum=0.9)
        runs.append(_closure_run(setup, opt, closure=closure, fault=S + 3, keyword=keyword))
    plain, closed = runs
    hooked = plain.trace.scalar("hooked")
    assert 0 < hooked.sum() < len(hooked) / 3 and hooked[S + 3] == 1  # (replayed)
    np.testing.assert_array_equal(closed.trace.scalar("hooked"), hooked)
    for col in ("act_absmax", "act_mean", "grad_norm", "param_norm", "update_ratio",
                "w_edited"):
        np.testing.assert_array_equal(closed.trace.col(col), plain.trace.col(col), col)
    for col in ("loss", "in_absmax", "lr"):
        np.testing.assert_array_equal(closed.trace.scalar(col), plain.trace.scalar(col), col)
    ff = closed.first_failure
    assert (ff.step, ff.kind) == (S + 3, "data_anomaly"), ff.message
    assert [(e.kind, e.layer, e.step, e.severity) for e in closed.events] == \
        [(e.kind, e.layer, e.step, e.severity) for e in plain.events]
    assert closed.recorder.replays == plain.recorder.replays > 0


def test_a_closure_of_an_optimizer_that_may_call_it_twice_is_hooked_as_it_runs():
    """An optimizer of another library may call the closure more than once in a step
    (SAM: before and after its ascent step): the step closes after the update, hooked as
    it runs, since its forward cannot be replayed before the update."""

    class Twice(torch.optim.SGD):  # (a class of another module than torch.optim's)
        def step(self, closure=None):
            closure()
            return super().step(closure)

    Twice.__module__ = "sam_like"
    setup = mlp()
    opt = Twice(setup.model.parameters(), lr=0.05)
    run = _closure_run(setup, opt, closure=True)
    assert (run.trace.scalar("hooked") == 1).all()
    assert np.isfinite(run.trace.scalar("loss")).all() and run.trace.n_steps == STEPS


def test_lbfgs_records_each_step_in_its_own_row():
    setup = mlp()
    opt = torch.optim.LBFGS(setup.model.parameters(), lr=0.05, max_iter=4)
    run = _closure_run(setup, opt, closure=True, fault=S)
    assert run.trace.n_steps == STEPS
    assert np.isfinite(run.trace.scalar("loss")).all()
    in_absmax = run.trace.scalar("in_absmax")
    assert in_absmax.argmax() == S and in_absmax[S] > 100 * in_absmax[S - 1]
    assert any((e.step, e.kind) == (S, "data_anomaly") for e in run.events)


@pytest.mark.parametrize("frozen", [True, False])
def test_a_loop_that_optimises_the_models_input_is_watched_step_by_step(frozen):
    """Style transfer, feature visualisation, adversarial examples: the optimizer trains
    the image fed to the model, not the model. Its steps are the watch's steps (not one
    block-long step with advice to make the optimizer again from the model), the image is
    not judged as data (optimised from all zeros, it is not "an input batch of zeros"),
    and a model that keeps its weights trainable is told that they are not updated."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))
    if frozen:
        net.requires_grad_(False)
    target = torch.randn(1, 8)
    # from all zeros (a feature visualisation's start): not "an input batch of zeros"
    img = (torch.zeros(1, 32) if frozen else 0.1 * torch.randn(1, 32)).requires_grad_(True)
    opt = torch.optim.Adam([img], lr=0.05)
    losses = []
    with ndbg.watch(net, report=False) as run:
        for _ in range(100):
            loss = F.mse_loss(net(img), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    assert run.trace.n_steps == 100 and not run.notes, run.notes
    assert np.isfinite(measured(run)).all()
    assert_no_errors(run)
    loud = {(e.kind, e.severity) for e in run.events if e.severity != "info"}
    assert loud == (set() if frozen else {("weights_not_updated", "warning")}), loud
    assert np.isnan(run.trace.scalar("in_absmax")).all()  # what trains is not data
