"""Precision: a model cast to bfloat16 (updates that round away are found at their step,
and the training is unchanged by the watch), a float64 model, and AMP with a GradScaler
on the CPU (healthy, skipped steps, the unscaled loss)."""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loops import assert_no_errors
from models import measured, mlp

import neuraldbg_nb as ndbg


def _half_training(dtype: torch.dtype, steps: int, drop_at: int | None = None
                   ) -> tuple[ndbg.Run, list[float]]:
    """The test MLP cast whole to `dtype` (`model.to(dtype)`, as memory-saving training
    does), AdamW at 1e-3, its learning rate dropped to 1e-5 at `drop_at`."""
    setup = mlp()
    model = setup.model.to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for step in range(steps):
            if step == drop_at:
                for group in opt.param_groups:
                    group["lr"] = 1e-5
            x, y = setup.batch(step)
            loss = F.cross_entropy(model(x.to(dtype)).float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return run, losses


def test_bfloat16_updates_that_round_away_are_found_at_their_step():
    """A model trained in bfloat16 whose learning rate drops to 1e-5 at step 40: from
    that update on, nearly every weight update is below bfloat16's precision and rounds
    away, so the model stops learning while every other number stays ordinary. The run
    says so at step 40, first for the first layer, with the cause; every layer stalled is
    the whole model stopped learning, an error and the first failure dated from step 40.
    The same training in float32 (whose small updates still land) and bfloat16 at 1e-3
    say nothing of it."""
    run, _ = _half_training(torch.bfloat16, 80, drop_at=40)
    first = run.first_failure
    assert (first.kind, first.signal, first.layer, first.step) == (
        "weights_not_updated", "model", None, 40), first
    assert "whole model stopped learning" in first.message and "1e-05" in first.message
    assert [e.signal for e in run.events if e.severity == "error"] == ["model"]
    rounded = [e for e in run.events if e.signal == "rounding"]
    assert [(e.layer, e.step, e.signal) for e in rounded] == \
        [("0", 40, "rounding"), ("2", 40, "rounding"), ("4", 40, "rounding")], rounded
    assert "half-precision weights exactly as they were at a learning rate of 1e-05" in \
        rounded[0].message
    assert "(half-precision updates round away) in 3 layers from step 40" in str(run)
    unmoved = run.trace.col("update_unmoved")[:, 0]
    assert (unmoved[40::10] >= 0.9).all() and (unmoved[:40][~np.isnan(unmoved[:40])] < 0.9).all()

    for dtype, drop_at in ((torch.float32, 40), (torch.bfloat16, None)):
        quiet, _ = _half_training(dtype, 120, drop_at=drop_at)
        assert not [e for e in quiet.events if e.kind == "weights_not_updated"], dtype
    assert not np.isnan(quiet.trace.col("update_unmoved")).all()  # measured in bfloat16 ...
    assert np.isnan(_half_training(torch.float32, 20)[0].trace.col("update_unmoved")).all()


def test_a_half_precision_training_is_unchanged_by_watching():
    """The update's unchanged weights are counted on copies: the losses of a bfloat16
    training are the same, bit for bit, with and without the watch."""
    _, watched = _half_training(torch.bfloat16, 30, drop_at=20)
    setup = mlp()
    model = setup.model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plain = []
    for step in range(30):
        if step == 20:
            for group in opt.param_groups:
                group["lr"] = 1e-5
        x, y = setup.batch(step)
        loss = F.cross_entropy(model(x.to(torch.bfloat16)).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        plain.append(loss.item())
    assert watched == plain


@pytest.mark.parametrize("fault", [False, True])
def test_a_float64_model_is_watched_and_its_fault_found(fault):
    """A model in float64 (`model.double()`: physics-informed nets, scientific code):
    the statistics of its input and activations are taken in float64 (`vector_norm`
    refuses to narrow them to float32, which would stop the watch at step 0), every column is
    recorded, the losses are those of the same training unwatched, and a weight set to
    NaN at a known step is found at its layer and step."""
    mid = mlp().layers["mid"]

    def training(watched: bool) -> tuple[ndbg.Run | None, list[float]]:
        setup = mlp()
        model = setup.model.double()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses = []
        with ndbg.watch(model, report=False) if watched else contextlib.nullcontext() as run:
            for step in range(60):
                if fault and step == 40:
                    with torch.no_grad():
                        model.get_submodule(mid).weight.view(-1)[0] = math.nan
                x, y = setup.batch(step)
                loss = F.cross_entropy(model(x.double()), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return run, losses

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "neuraldbg stopped watching" is a RuntimeWarning
        run, losses = training(True)
    assert run is not None and run.trace.n_steps == 60 and not run.notes
    np.testing.assert_array_equal(losses, training(False)[1])  # NaN equals NaN here
    ff = run.first_failure
    if not fault:
        assert ff is None, ff
        sampled = run.trace.col("act_std")[::10]
        assert np.isfinite(sampled[:, run.trace.layer_index(mid)]).all()
        assert np.isfinite(run.trace.scalar("in_std")[::10]).all()
    else:
        assert (ff.layer, ff.step) == (mid, 40), ff


def _amp_loop(setup, steps, *, skip_at=(), log_loss_to=None):
    model = setup.model
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    real_steps = [0]
    handle = opt.register_step_post_hook(lambda *a: real_steps.__setitem__(0, real_steps[0] + 1))
    losses = []
    for step in range(steps):
        x, y = setup.batch(step)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        if log_loss_to is not None:
            log_loss_to.log_loss(loss)
        scaler.scale(loss).backward()
        if step in skip_at:  # an overflow in the backward: the scaler skips this step
            model[2].weight.grad.view(-1)[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        losses.append(loss.detach().float())
    handle.remove()
    return real_steps[0], scaler, losses


def test_amp_gradscaler_cpu_bfloat16_healthy():
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        real, _, _ = _amp_loop(setup, 80)
    assert real == 80
    assert run.trace.n_steps == 80
    assert_no_errors(run)
    assert run.first_failure is None
    assert np.isfinite(measured(run)).all()


def test_amp_skipped_steps_are_not_a_failure():
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        real, scaler, _ = _amp_loop(setup, 80, skip_at=(40, 41, 42))
    assert real == 77, "the scaler should have skipped three steps"
    assert scaler.get_scale() == 65536.0 / 8
    # steps are optimizer steps: a skipped iteration is not a step of its own
    assert run.trace.n_steps == real
    assert_no_errors(run)
    assert run.first_failure is None
    assert np.isfinite(run.trace.col("grad_norm")[:, [0, 2, 4]]).all()


def test_amp_log_loss_records_the_unscaled_loss():
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        _, _, losses = _amp_loop(setup, 30, log_loss_to=run)
    recorded = run.trace.scalar("loss")
    np.testing.assert_allclose(recorded, torch.stack(losses).double().numpy(), rtol=1e-3)
    assert recorded.max() < 10  # not the scaled loss (x65536)
