"""Mistakes of the training loop in real trainings (`detect.loop`): a model left in eval mode
after an evaluation (and what is not: layers frozen in eval mode on purpose, a frozen
teacher), a loop without zero_grad (also when it clips or unscales its gradients, and
not when it zeroes them in any usual way), weights that get no gradient at the step, and
an optimizer stepped twice per backward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loops import STEPS, assert_no_errors, relu_mlp, setup_loop, task_batches, task_loop
from models import mlp
from torch import nn

import neuraldbg_nb as ndbg


def _dropout_bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(16, 2))


def _validate_and_forget_train(at: int, back: int | None = None):
    """An evaluation at step `at` that leaves the model in eval mode (no `model.train()`
    after it); `model.train()` again at step `back`."""
    x, _ = task_batches(1)

    def hook(step, m, opt):
        if step == at:
            m.eval()
            with torch.no_grad():
                m(x[0])
        if step == back:
            m.train()
    return hook


def test_a_model_left_in_eval_mode_after_an_evaluation_is_a_warning_from_that_step():
    """A quiet bug common in notebooks: evaluate, forget `model.train()`, train on
    without dropout and with BatchNorm frozen on its running statistics. One warning at
    the first step trained so, ended when `model.train()` comes back; no error, and the
    training is the same with and without the watch."""
    model = _dropout_bn_model()
    with ndbg.watch(model, report=False) as run:
        losses = task_loop(model, STEPS, on_step_start=_validate_and_forget_train(12, 30))
    assert torch.equal(torch.stack(losses), torch.stack(
        task_loop(_dropout_bn_model(), STEPS, on_step_start=_validate_and_forget_train(12, 30))))
    (warned,) = [e for e in run.events if e.kind == "eval_mode"]
    assert (warned.step, warned.layer, warned.severity, warned.end) == (12, None, "warning", 30)
    assert "2 dropout/BatchNorm layers" in warned.message, warned.message
    assert any(e.kind == "recovery" and e.step == 30 for e in run.events)
    eval_layers = run.trace.scalar("eval_layers")
    assert (eval_layers[:12] == 0).all() and (eval_layers[12:30] == 2).all() \
        and (eval_layers[30:] == 0).all()
    assert_no_errors(run)
    assert "eval mode" in str(run)


def test_training_mode_deliberately_frozen_layers_and_models_without_them_are_quiet():
    """Not flagged: evaluations that call `model.train()` after them; BatchNorm put in
    eval mode on purpose inside a model in training mode (fine-tuning); a model in eval
    mode that has no layer acting by mode (it trains the same either way)."""
    def freeze_bn(step, m, opt):
        if step == 0:
            m[1].eval()

    plain = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
    for model, hook in [(_dropout_bn_model(), _validate_and_forget_train(12, back=12)),
                        (_dropout_bn_model(), freeze_bn), (plain, None)]:
        with ndbg.watch(model, report=False) as run:
            task_loop(model, 24, on_step_start=hook)
        assert not [e for e in run.events if e.kind == "eval_mode"], model
        assert (run.trace.scalar("eval_layers") == 0).all()


def test_a_frozen_teacher_in_eval_mode_is_not_flagged():
    """A frozen model kept in eval mode on purpose and called with gradients on (a
    teacher whose outputs the student's loss backpropagates through, a perceptual loss
    network): `watch()` without a model finds it, and it is not training in eval mode."""
    torch.manual_seed(1)
    teacher = nn.Sequential(nn.Linear(2, 16), nn.Dropout(0.3), nn.Linear(16, 2)).eval()
    teacher.requires_grad_(False)
    student = _dropout_bn_model()
    x, y = task_batches()
    opt = torch.optim.SGD(student.parameters(), lr=0.05)
    with ndbg.watch(report=False) as run:
        for step in range(20):
            opt.zero_grad()
            logits = student(x[step])
            (F.cross_entropy(logits, y[step]) + teacher(logits).square().mean()).backward()
            opt.step()
    assert any(name.startswith("Sequential1.") for name in run.trace.layer_names), \
        "the teacher is watched"
    assert not [e for e in run.events if e.kind == "eval_mode"]
    assert (run.trace.scalar("eval_layers") == 0).all()


def test_a_teacher_trained_then_frozen_keeps_no_gradient_of_its_own():
    """Knowledge distillation: the teacher trained first, then frozen with
    `requires_grad_(False)` and called under `torch.no_grad()`; its weights keep the
    `.grad` of its last training step. That gradient is not this run's: its layers read
    no gradient, and no note calls them trained layers whose forward went unheard."""
    torch.manual_seed(1)
    x, y = task_batches()
    teacher = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    F.cross_entropy(teacher(x[0]), y[0]).backward()  # its training's last gradient
    teacher.eval().requires_grad_(False)
    student = relu_mlp()
    opt = torch.optim.SGD(student.parameters(), lr=0.05)
    with ndbg.watch([student, teacher], report=False) as run:
        for step in range(30):
            opt.zero_grad()
            with torch.no_grad():
                target = F.softmax(teacher(x[step]) / 2, dim=1)
            logits = student(x[step])
            loss = F.cross_entropy(logits, y[step]) + F.kl_div(
                F.log_softmax(logits / 2, dim=1), target, reduction="batchmean")
            loss.backward()
            opt.step()
    teacher_layers = [j for j, n in enumerate(run.trace.layer_names) if n.startswith("1.")]
    assert teacher_layers and np.isnan(run.trace.col("grad_norm")[:, teacher_layers]).all()
    assert not [n for n in run.notes if "never ran through" in n], run.notes
    assert_no_errors(run)


def test_a_loop_without_zero_grad_is_the_first_failure_from_step_1():
    """Without zero_grad every backward adds to all the earlier gradients. What shows,
    dozens of steps later, is a layer dying or jumping; the first failure is the loop: an
    error from step 1 (step 0 has no earlier gradient), and with stop_on="error" the
    training stops there, not after the damage."""
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        setup_loop(setup, 80, zero=lambda: None)
    first = run.first_failure
    assert (first.kind, first.step, first.layer) == ("grads_not_zeroed", 1, None), first
    assert [e for e in run.events if e.kind != "grads_not_zeroed"], "it did break things"
    assert all(e.step >= 1 for e in run.symptoms)

    setup = mlp()
    with pytest.raises(ndbg.TrainingFailure) as stopped, \
            ndbg.watch(setup.model, report=False, stop_on="error"):
        setup_loop(setup, 80, zero=lambda: None)
    run = stopped.value.run
    assert run.first_failure.kind == "grads_not_zeroed"
    assert run.trace.n_steps <= 5, run.trace.n_steps


def _clipped_loop(model: nn.Module, steps: int, how: str, zero: str) -> None:
    """A loop that changes its gradients in place between the backward and the step
    (`how`: clip_grad_norm_, or GradScaler's unscale_), and zeroes them `zero`: "never",
    "before" the backward, "before, in place" (set_to_none=False), "after" the step in
    place, or "accumulate" (three backwards per step, zeroed once before them)."""
    setup = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 4)
    for step in range(steps):
        if zero.startswith("before") or zero == "accumulate":
            opt.zero_grad(set_to_none=zero != "before, in place")
        for k in range(3 if zero == "accumulate" else 1):
            x, y = setup.batch(3 * step + k)
            loss = F.cross_entropy(model(x), y)
            (scaler.scale(loss) if how == "unscale_" else loss).backward()
        if how == "unscale_":
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        if zero == "after":
            opt.zero_grad(set_to_none=False)


@pytest.mark.parametrize("how", ["clip_grad_norm_", "unscale_"])
def test_a_loop_without_zero_grad_that_clips_or_unscales_is_the_first_failure(how):
    """A loop without zero_grad whose gradients are clipped or unscaled in place before
    the step: the in-place change moves the gradient's version as zero_grad(set_to_none=
    False) does, so the version alone cannot tell. The gradient's values at each
    backward's start (the last step's, still there) tell it: an error from step 1, the
    first failure."""
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        _clipped_loop(setup.model, 40, how, "never")
    first = run.first_failure
    assert first is not None and (first.kind, first.step) == ("grads_not_zeroed", 1), \
        first or run.events
    carried = run.trace.scalar("grad_carried")
    assert np.isnan(carried[0]) and (carried[1:] == 1).all(), carried


@pytest.mark.parametrize("zero", ["before", "before, in place", "after", "accumulate"])
@pytest.mark.parametrize("how", ["clip_grad_norm_", "unscale_"])
def test_a_loop_that_clips_or_unscales_and_zeroes_is_not_carried_over(how, zero):
    """The same loops with their gradients zeroed, in every usual way: quiet."""
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        _clipped_loop(setup.model, 30, how, zero)
    carried = run.trace.scalar("grad_carried")
    assert np.isnan(carried[0]) and (carried[1:] == 0).all(), carried
    assert not [e for e in run.events if e.kind == "grads_not_zeroed"]


def test_a_gan_whose_generator_alone_is_watched_zeroes_in_place_without_a_false_alarm():
    """A GAN with zero_grad(set_to_none=False), only its generator watched: the
    critic's own backward (on a detached fake) adds nothing to the generator's gradient,
    and the generator's zero_grad zeroes it in place. Read from the version counter, which
    both backwards move, it would look as if nothing had zeroed it (an error at step 1 on
    a correct loop). The gradient's values at each backward's start tell it: quiet."""
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    critic = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g = torch.optim.Adam(gen.parameters(), 1e-3)
    opt_c = torch.optim.Adam(critic.parameters(), 1e-3)
    bce = nn.BCEWithLogitsLoss()
    data = torch.Generator().manual_seed(1)
    with ndbg.watch(gen, report=False) as run:
        for _ in range(30):
            real = torch.randn(64, 2, generator=data) + 1
            z = torch.randn(64, 8, generator=data)
            opt_c.zero_grad(set_to_none=False)
            (bce(critic(real), torch.ones(64, 1))
             + bce(critic(gen(z).detach()), torch.zeros(64, 1))).backward()
            opt_c.step()
            opt_g.zero_grad(set_to_none=False)
            bce(critic(gen(z)), torch.ones(64, 1)).backward()
            opt_g.step()
    carried = run.trace.scalar("grad_carried")
    assert np.isnan(carried[0]) and (carried[1:] == 0).all(), carried
    assert not [e for e in run.events if e.severity == "error"], run.events


def test_zeroed_gradients_of_every_kind_are_not_carried_over():
    """zero_grad() (a new gradient each step), zero_grad(set_to_none=False) (zeroed in
    place), and gradient accumulation (three backwards per optimizer step, zeroed once)
    carry nothing over."""
    for how in ("set_to_none", "in_place", "accumulate"):
        setup = mlp()
        model = setup.model
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        with ndbg.watch(model, report=False) as run:
            for step in range(30):
                opt.zero_grad(set_to_none=how != "in_place")
                for k in range(3 if how == "accumulate" else 1):
                    x, y = setup.batch(3 * step + k)
                    F.cross_entropy(model(x), y).backward()
                opt.step()
        carried = run.trace.scalar("grad_carried")
        assert np.isnan(carried[0]) and (carried[1:] == 0).all(), (how, carried)
        assert not [e for e in run.events if e.kind == "grads_not_zeroed"]


class Detached(nn.Module):
    """A model whose output is detached before the loss: its weights get no gradient."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).detach()


@pytest.mark.parametrize("how", ["zero_grad after backward", "output detached"])
def test_a_loop_whose_weights_get_no_gradient_at_the_step_is_the_first_failure(how):
    """zero_grad() between backward() and step(), or a loss that does not depend on the
    model: nothing trains, and no gradient number is there for the other detectors. The
    loop is the first failure, at step 0, and stop_on stops there."""
    def loop(model: nn.Module, steps: int) -> None:
        x, y = task_batches()
        scale = nn.Parameter(torch.ones(2))  # something trains, whatever the model does
        opt = torch.optim.SGD([*model.parameters(), scale], lr=0.05)
        for step in range(steps):
            if how == "output detached":
                opt.zero_grad()
            loss = F.cross_entropy(model(x[step]) * scale, y[step])
            loss.backward()
            if how != "output detached":
                opt.zero_grad()
            opt.step()

    make = relu_mlp if how != "output detached" else Detached
    model = make()
    before = [p.detach().clone() for p in model.parameters()]
    with ndbg.watch(model, report=False) as run:
        loop(model, 20)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    first = run.first_failure
    assert (first.kind, first.step, first.layer) == ("no_gradients", 0, None), first
    assert "nothing trains" in first.message
    model = make()
    with pytest.raises(ndbg.TrainingFailure) as stopped, \
            ndbg.watch(model, report=False, stop_on="error"):
        loop(model, 40)
    assert stopped.value.run.trace.n_steps <= 4


def _sgd_by_hand(steps: int, zero, close_first: bool) -> ndbg.Run:
    """SGD written out, without an optimizer: the update, then `zero(model)` clears the
    gradients, and `run.step()` closes the step before it (`close_first`) or after."""
    model = relu_mlp()
    x, y = task_batches()
    with ndbg.watch(model, report=False) as run:
        for step in range(steps):
            F.cross_entropy(model(x[step]), y[step]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad
            if close_first:
                run.step()
            zero(model)
            if not close_first:
                run.step()
    return run


def _zero_in_place(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad.zero_()


def test_a_loop_stepped_by_hand_may_clear_its_gradients():
    """Steps closed by run.step() are not judged for missing gradients: such a loop
    updates the weights itself and may clear the gradients before closing the step."""
    run = _sgd_by_hand(10, lambda model: model.zero_grad(), close_first=False)
    assert np.isnan(run.trace.scalar("grads_missing")).all()
    assert run.first_failure is None


@pytest.mark.parametrize("zero", [_zero_in_place,
                                  lambda model: model.zero_grad(set_to_none=False)],
                         ids=["in_place", "zero_grad_keep"])
def test_gradients_zeroed_in_place_before_a_step_closed_by_hand_are_not_measured(zero):
    """The textbook loop without an optimizer: `p -= lr * p.grad; p.grad.zero_()`, then
    `run.step()`. Every gradient reads exactly 0 where the step closes: not a vanishing
    gradient of every layer, but gradients not measured, and a note says where to call
    `run.step()`. Closed before the zeroing, they are measured."""
    runs = {late: _sgd_by_hand(60, zero, close_first=not late) for late in (True, False)}
    late, early = runs[True], runs[False]
    assert not late.events, [str(e) for e in late.events]
    assert np.isnan(late.trace.col("grad_norm")).all()
    assert any("before it called run.step()" in n for n in late.notes), late.notes
    assert (early.trace.col("grad_norm")[:, [0, 2, 4]] > 0).all()
    assert not any("run.step()" in n for n in early.notes), early.notes
    assert not [e for e in early.events if e.severity == "error"]


def test_an_optimizer_stepped_twice_per_backward_is_a_warning_where_it_began():
    """`opt.step()` called a second time after one backward, from batch 30 on: the same
    gradients applied twice. Only this rule sees it (every other step has no loss, and the
    gradients are never "carried" two steps in a row)."""
    setup = mlp()
    opt = setup.make_opt(setup.model)
    with ndbg.watch(setup.model, report=False) as run:
        for i in range(50):
            x, y = setup.batch(i)
            opt.zero_grad()
            setup.loss_fn(setup.model(x), y).backward()
            opt.step()
            if i >= 30:
                opt.step()
    assert run.trace.n_steps == 70
    loud = [(e.kind, e.step, e.severity) for e in run.events if e.severity != "info"]
    assert loud == [("step_repeated", 31, "warning")], [str(e) for e in run.events]
    assert "without a backward" in next(e for e in run.events if e.severity != "info").message
    # a loop without an optimizer, closed by hand, with no backward in some steps, is not
    with ndbg.watch(setup.model, report=False) as run:
        for i in range(20):
            if i % 2 == 0:
                x, y = setup.batch(i)
                setup.model.zero_grad()
                setup.loss_fn(setup.model(x), y).backward()
                with torch.no_grad():
                    for p in setup.model.parameters():
                        p -= 0.01 * p.grad
            run.step()
    assert run.trace.n_steps == 20
    assert not [e for e in run.events if e.kind == "step_repeated"]


@pytest.mark.parametrize("how", ["clipped to a norm of 0", "zeroed in place after backward"])
def test_gradients_all_exactly_0_at_the_step_are_the_first_failure(how):
    """Every gradient exactly 0 at the optimizer's step while the loss is not: clipped
    with a max_norm of 0 (a setting meant as "no clipping"), or zeroed in place between
    backward() and step(). Nothing trains; the loop is the first failure at step 0. The
    same loop clipping to a norm of 1, or zeroing before the backward, is quiet."""
    def loop(model: nn.Module, steps: int, bug: bool) -> None:
        x, y = task_batches()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(steps):
            if not bug:
                opt.zero_grad(set_to_none=False)
            F.cross_entropy(model(x[step]), y[step]).backward()
            if how.startswith("clipped"):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.0 if bug else 1.0)
            elif bug:
                opt.zero_grad(set_to_none=False)
            opt.step()

    model = relu_mlp()
    before = [p.detach().clone() for p in model.parameters()]
    with ndbg.watch(model, report=False) as run:
        loop(model, 20, bug=True)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    first = run.first_failure
    assert (first.kind, first.step, first.layer) == ("no_gradients", 0, None), first
    assert "every gradient was exactly 0" in first.message
    model = relu_mlp()
    with ndbg.watch(model, report=False) as healthy:
        loop(model, 20, bug=False)
    assert_no_errors(healthy)
    assert not [e for e in healthy.events if e.kind == "no_gradients"]
