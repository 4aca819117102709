"""Loop hygiene judged for every optimizer, in a GAN's real loop: the generator's
optimizer never zeroed, stepped twice per backward, or stepped with its gradients cleared
before it; the discriminator's loop is right, and its healthy twin is quiet."""

from __future__ import annotations

import contextlib

import pytest
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
                                                     "cut_off", "not_in_optimizer",
                                                     "optimizer_remade")]
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


def _remade(make, every: int | None, steps: int = 40, watched: bool = True):
    """A classifier whose optimizer (`make(params)`) is built anew every `every` steps (None:
    once, before the loop), as a loop that builds it inside does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    gen = torch.Generator().manual_seed(1)
    opt = make(model.parameters())
    losses = []
    with ndbg.watch(model, report=False) if watched else contextlib.nullcontext() as run:
        for step in range(steps):
            if every is not None and step % every == 0:
                opt = make(model.parameters())
            x = torch.randn(32, 8, generator=gen)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), (x[:, 0] > 0).long() + (x[:, 1] > 0).long())
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return run, losses


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.Adam(p, lr=1e-3),
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)])
def test_an_optimizer_built_inside_the_loop_is_a_warning_from_step_1(make):
    """Adam (its running averages) or SGD with momentum made anew at every step: each
    update is a first one. A warning dated from step 1, the first step whose optimizer
    was made anew; the training is the same as without the watch."""
    run, losses = _remade(make, every=1)
    assert losses == _remade(make, every=1, watched=False)[1]
    (e,) = [e for e in run.events if e.kind == "optimizer_remade"]
    assert (e.step, e.severity, e.layer) == (1, "warning", None), e
    assert "Build the optimizer once, before the loop" in e.message


@pytest.mark.parametrize(("make", "every"), [
    (lambda p: torch.optim.Adam(p, lr=1e-3), None),
    (lambda p: torch.optim.Adam(p, lr=1e-3), 10),
    (lambda p: torch.optim.SGD(p, lr=0.05), 1)])
def test_an_optimizer_built_once_once_an_epoch_or_keeping_no_state_is_quiet(make, every):
    """Built once; built anew once an epoch (every 10 steps); plain SGD, which keeps no
    state between steps, built at every step."""
    run, _ = _remade(make, every)
    assert not [e for e in run.events if e.kind == "optimizer_remade"], run.events
