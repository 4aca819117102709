"""Loop hygiene judged for every optimizer, in a GAN's real loop: the generator's
optimizer never zeroed, stepped twice per backward, or stepped with its gradients cleared
before it; the discriminator's loop is right, and its healthy twin is quiet."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from loops import assert_no_errors
from models import gan
from torch import nn

import neuraldbg_nb as ndbg


def _gan(steps: int = 30, zero_g: bool = True, twice: bool = False,
         clear_before_step: bool = False):
    g = gan()
    G, D, opt_g, opt_d, gen = g.G, g.D, g.opt_g, g.opt_d, g.gen
    bce = F.binary_cross_entropy_with_logits
    losses = []
    with ndbg.watch({"G": G, "D": D}, report=False) as run:
        for _ in range(steps):
            real = torch.randn(32, 2, generator=gen) * 0.5 + 1.0
            z = torch.randn(32, 4, generator=gen)
            opt_d.zero_grad()
            fake = G(z)
            loss_d = bce(D(real), torch.ones(32, 1)) + bce(D(fake.detach()), torch.zeros(32, 1))
            loss_d.backward()
            opt_d.step()
            if zero_g:
                opt_g.zero_grad()
            loss_g = bce(D(fake), torch.ones(32, 1))
            loss_g.backward()
            if clear_before_step:
                opt_g.zero_grad()
            opt_g.step()
            if twice:
                opt_g.step()
            losses.append((loss_d.item(), loss_g.item()))
    return run, losses


def test_a_gans_second_optimizer_never_zeroed_is_the_first_failure():
    """The discriminator's optimizer closes the steps and zeroes its gradients; the
    generator's never does. Its gradients are read as each backward starts, as the first
    optimizer's are: an error from the first step it can be told (the generator's second
    step, given at the boundary after it: step 2)."""
    run, _ = _gan(zero_g=False)
    first = run.first_failure
    assert (first.kind, first.layer, first.step) == ("grads_not_zeroed", None, 2), first
    assert "zero_grad()" in first.message


def test_a_gans_second_optimizer_stepped_twice_is_said():
    run, _ = _gan(twice=True)
    repeated = [e for e in run.events if e.kind == "step_repeated"]
    assert repeated and repeated[0].step <= 3, run.events
    assert "twice" in repeated[0].message


def test_a_gans_second_optimizer_with_its_gradients_cleared_before_its_step_is_an_error():
    """`zero_grad()` between the generator's backward and its step: its optimizer steps on
    no gradient at every iteration; the discriminator trains. An error naming the
    generator's first layer, dated from step 0."""
    run, _ = _gan(clear_before_step=True)
    first = run.first_failure
    assert (first.kind, first.layer, first.step) == ("cut_off", "G.0", 0), first
    assert "cleared between backward() and its optimizer's step" in first.message


def test_a_healthy_gan_loop_is_quiet():
    run, _ = _gan()
    assert not [e for e in run.events if e.kind in ("grads_not_zeroed", "step_repeated",
                                                     "cut_off", "not_in_optimizer")]
    assert_no_errors(run)
    assert (run.trace.scalar("others_carried")[2:] == 0).all()


def _dropout_bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(16, 2))


def _train_with_eval_at(at: int, back: int | None, steps: int):
    from loops import task_batches, task_loop
    x, _ = task_batches(1)

    def hook(step, m, opt):
        if step == at:
            m.eval()
            with torch.no_grad():
                m(x[0])
        if step == back:
            m.train()
    model = _dropout_bn_model()
    with ndbg.watch(model, report=False) as run:
        task_loop(model, steps, on_step_start=hook)
    return run


def test_a_model_kept_in_eval_mode_for_the_rest_of_the_run_is_an_error_from_its_first_step():
    """An evaluation at step 12 that forgets `model.train()`, and 100 steps of training
    after it without dropout and on frozen BatchNorm statistics: a warning at step 12 that
    becomes an error after `eval_steps` (50), and the first failure, dated from step 12."""
    run = _train_with_eval_at(12, None, 100)
    first = run.first_failure
    assert (first.kind, first.step, first.layer) == ("eval_mode", 12, None), first
    errors = [e for e in run.events if e.severity == "error"]
    assert [(e.kind, e.step) for e in errors] == [("eval_mode", 61)], errors
    assert "for 50 steps in a row" in errors[0].message and "model.train()" in errors[0].message


def test_a_short_evaluation_stretch_stays_a_warning():
    run = _train_with_eval_at(12, 40, 100)
    assert [e.severity for e in run.events if e.kind == "eval_mode"] == ["warning"]
    assert_no_errors(run)
