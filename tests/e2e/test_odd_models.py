"""Models and loops off the beaten path: tuple and dict outputs, a module returning None,
integer inputs, frozen parameters, parameters outside the optimizer, AMP with a
GradScaler on the CPU, torch.compile, `watch()` without a model, and the errors a user
gets for a wrong argument or a misspelt threshold."""

from __future__ import annotations

import contextlib
import math
import os
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import leftover_global_hooks, leftover_module_hooks
from models import cnn, mlp, train, transformer
from torch import nn

import neuraldbg_nb as ndbg

S = 30
STEPS = 45


def _batches(seed: int = 0, n: int = 400):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, 6, generator=gen)
    y = (x[:, :, 0] + x[:, :, 1] > 0).long()
    return x, y


def _scale_weight_at(model: nn.Module, layer: str, step: int, factor: float = 1000.0):
    def hit(s, m, o):
        if s == step:
            with torch.no_grad():
                model.get_submodule(layer).weight.mul_(factor)
    return hit


def _loop(model: nn.Module, steps: int, *, opt=None, out_to_logits=lambda o: o,
          on_step_start=None, lr: float = 0.05, zero=None):
    """Train `model` on a fixed 6-feature, 2-class task; returns the losses."""
    x, y = _batches()
    opt = opt if opt is not None else torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        if on_step_start is not None:
            on_step_start(step, model, opt)
        (zero or opt.zero_grad)()
        loss = F.cross_entropy(out_to_logits(model(x[step])), y[step])
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def _no_errors(run) -> None:
    errors = [str(e) for e in run.events if e.severity == "error"]
    assert not errors, errors


# -- odd outputs ----------------------------------------------------------------------
class TupleBlock(nn.Module):
    """A layer with parameters that returns a tuple (like attention or an RNN)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 16) / 6 ** 0.5)
        self.bias = nn.Parameter(torch.zeros(16))

    def forward(self, x):
        h = x @ self.weight + self.bias
        return h, h.detach().mean()


class TupleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = TupleBlock()
        self.act = nn.ReLU()
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        h, aux = self.block(x)
        return self.head(self.act(h)), aux


class DictBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 16)

    def forward(self, x):
        return {"mask": x > 0, "hidden": self.fc(x)}  # first entry: not floating point


class DictModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = DictBlock()
        self.act = nn.Tanh()
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        out = self.block(x)
        return {"logits": self.head(self.act(out["hidden"])), "hidden": out["hidden"]}


class Recorder(nn.Module):
    """A leaf module used for a side effect only: it returns None."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def forward(self, x):
        self.seen += 1


class NoneModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.record = Recorder()
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        h = self.fc1(x)
        self.record(h)
        return self.fc2(self.act(h))


ODD = {
    "tuple": (TupleModel, lambda o: o[0], "block"),
    "dict": (DictModel, lambda o: o["logits"], "block.fc"),
    "none-inside": (NoneModel, lambda o: o, "fc1"),
}


@pytest.mark.parametrize("kind", list(ODD))
def test_odd_outputs_are_watched(kind):
    make, logits, faulty = ODD[kind]
    torch.manual_seed(0)
    model = make()
    with ndbg.watch(model, report=False) as run:
        losses = _loop(model, 40, out_to_logits=logits)
    assert torch.stack(losses)[-10:].mean() < torch.stack(losses)[:10].mean()
    assert run.trace.n_steps == 40
    _no_errors(run)
    names = run.trace.layer_names
    assert faulty in names, names
    a = run.trace.col("act_absmax")[:, names.index(faulty)]
    assert np.isfinite(a).all() and (a > 0).all(), f"{faulty} activations not measured"
    assert np.isfinite(run.trace.scalar("in_absmax")).all()
    assert leftover_module_hooks(model) == []


@pytest.mark.parametrize("kind", list(ODD))
def test_odd_outputs_fault_is_found(kind):
    make, logits, faulty = ODD[kind]
    torch.manual_seed(0)
    model = make()
    target = faulty
    with ndbg.watch(model, report=False) as run:
        _loop(model, STEPS, out_to_logits=logits,
              on_step_start=_scale_weight_at(model, target, S))
    ff = run.first_failure
    assert ff is not None
    assert (ff.step, ff.layer) == (S, target), ff.message


def test_module_returning_none_is_harmless():
    torch.manual_seed(0)
    model = NoneModel()
    with ndbg.watch(model, report=False) as run:
        _loop(model, 20)
    assert model.record.seen == 20
    names = run.trace.layer_names
    if "record" in names:  # a layer with nothing to measure: no numbers, no events
        assert np.isnan(run.trace.col("act_absmax")[:, names.index("record")]).all()
        assert not [e for e in run.events if e.layer == "record"]
    _no_errors(run)


class TrainsInside(nn.Module):
    """A model that runs its own backward and returns None: its last layer, a sigmoid,
    is not the model's output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> None:
        self.gate(self.fc(x)).square().mean().backward()


def test_a_model_returning_none_keeps_its_last_sigmoid_judged_for_saturation():
    model = TrainsInside()
    x, _ = _batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ndbg.watch(model, report=False) as run:
        for step in range(5):
            opt.zero_grad()
            model(x[step])
            opt.step()
    assert [(i.name, i.role) for i in run.trace.layers] == [("fc", "other"),
                                                           ("gate", "bounded")]


def _eval_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16),
                         nn.ReLU(inplace=True), nn.Linear(16, 2))


def test_evaluation_passes_inside_the_loop_are_left_out():
    """An evaluation every few steps (eval mode, no_grad or inference_mode) on a
    validation set unlike the training set, ten times its scale and with a NaN in one
    batch, trains nothing: the run records exactly what the same training records
    without it. Before, its batches and activations joined the next training step's: a
    jump of every layer, then a non-finite error, at training steps that were healthy."""
    x, _ = _batches(1)
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
        model = _eval_model()
        with ndbg.watch(model, report=False) as run:
            losses = _loop(model, 24, on_step_start=on_step_start)
        runs.append((run, torch.stack(losses)))
    (plain, plain_losses), (evaluated, losses) = runs
    assert torch.equal(losses, plain_losses)
    assert evaluated.trace.layer_names == plain.trace.layer_names
    for col in ("act_absmax", "act_mean", "grad_norm"):
        np.testing.assert_array_equal(evaluated.trace.col(col), plain.trace.col(col))
    for col in ("in_absmax", "in_nonfinite", "in_mean"):
        np.testing.assert_array_equal(evaluated.trace.scalar(col), plain.trace.scalar(col))
    assert [str(e) for e in evaluated.events] == [str(e) for e in plain.events]
    _no_errors(evaluated)
    assert evaluated.notes == []


def test_a_block_that_only_evaluates_says_why_no_activations_were_recorded():
    model = _eval_model()
    x, _ = _batches(1)
    with ndbg.watch(model, report=False) as run, torch.no_grad():
        for step in range(3):
            model(x[step])
            run.step()
    assert run.trace.n_steps == 3
    assert np.isnan(run.trace.col("act_absmax")).all()
    (note,) = run.notes
    assert "gradients off" in note and "no activations were recorded" in note


def _dropout_bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(16, 2))


def _validate_and_forget_train(at: int, back: int | None = None):
    """An evaluation at step `at` that leaves the model in eval mode (no `model.train()`
    after it); `model.train()` again at step `back`."""
    x, _ = _batches(1)

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
        losses = _loop(model, STEPS, on_step_start=_validate_and_forget_train(12, 30))
    assert torch.equal(torch.stack(losses), torch.stack(
        _loop(_dropout_bn_model(), STEPS, on_step_start=_validate_and_forget_train(12, 30))))
    (warned,) = [e for e in run.events if e.kind == "eval_mode"]
    assert (warned.step, warned.layer, warned.severity, warned.end) == (12, None, "warning", 30)
    assert "2 dropout/BatchNorm layers" in warned.message, warned.message
    assert any(e.kind == "recovery" and e.step == 30 for e in run.events)
    eval_layers = run.trace.scalar("eval_layers")
    assert (eval_layers[:12] == 0).all() and (eval_layers[12:30] == 2).all() \
        and (eval_layers[30:] == 0).all()
    _no_errors(run)
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
            _loop(model, 24, on_step_start=hook)
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
    x, y = _batches()
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


def test_a_loop_without_zero_grad_is_the_first_failure_from_step_1():
    """Without zero_grad every backward adds to all the earlier gradients. What showed,
    dozens of steps later, was a layer dying or jumping, and that was blamed. Now the
    loop is: an error from step 1 (step 0 has no earlier gradient), and with
    stop_on="error" the training stops there, not after the damage."""
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        _loop_setup(setup, 80, zero=lambda: None)
    first = run.first_failure
    assert (first.kind, first.step, first.layer) == ("grads_not_zeroed", 1, None), first
    assert [e for e in run.events if e.kind != "grads_not_zeroed"], "it did break things"
    assert all(e.step >= 1 for e in run.symptoms)

    setup = mlp()
    with pytest.raises(ndbg.TrainingFailure) as stopped, \
            ndbg.watch(setup.model, report=False, stop_on="error"):
        _loop_setup(setup, 80, zero=lambda: None)
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
    False) does, and the run said nothing. The gradient's values at each backward's start
    (the last step's, still there) tell it: an error from step 1, the first failure."""
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
    and the generator's zero_grad zeroes it in place. The version counter moved by the
    two backwards heard, as if nothing had zeroed it: an error at step 1 on a correct
    loop. The gradient's values at each backward's start tell it: quiet."""
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
    run said "no failure found". Now the loop is the first failure, at step 0, and
    stop_on stops there."""
    def loop(model: nn.Module, steps: int) -> None:
        x, y = _batches()
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

    make = _eval_model if how != "output detached" else Detached
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


def test_a_loop_stepped_by_hand_may_clear_its_gradients():
    """Steps closed by run.step() are not judged for missing gradients: such a loop
    updates the weights itself and may clear the gradients before closing the step."""
    model = _eval_model()
    x, y = _batches()
    with ndbg.watch(model, report=False) as run:
        for step in range(10):
            F.cross_entropy(model(x[step]), y[step]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad
            model.zero_grad()
            run.step()
    assert np.isnan(run.trace.scalar("grads_missing")).all()
    assert run.first_failure is None


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


class FrozenBackbone(nn.Module):
    """Transfer learning: a frozen backbone run under no_grad inside the forward, then a
    head that trains."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.backbone(x)
        return self.head(features)


def test_a_frozen_backbone_run_under_no_grad_inside_the_forward_is_recorded():
    """What is left out is a model called with gradients off, not a layer: a backbone run
    under no_grad inside a forward that trains is part of the training step."""
    model = FrozenBackbone()

    def corrupt(step, m, opt):
        if step == S:
            with torch.no_grad():
                m.backbone[2].weight.mul_(1000)

    with ndbg.watch(model, report=False) as run:
        _loop(model, STEPS, on_step_start=corrupt,
              opt=torch.optim.SGD(model.head.parameters(), lr=0.05))
    assert not np.isnan(run.trace.col("act_absmax")).any()
    assert run.notes == []
    first = run.first_failure
    assert first is not None and (first.layer, first.step) == ("backbone.2", S), first


class Checkpointed(nn.Module):
    """A block run through gradient checkpointing, then a head: the reentrant kind runs
    the block's first forward with gradients off, inside the model's call, and again in
    the backward."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Linear(6, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 2)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.utils.checkpoint.checkpoint(self.block, self.stem(x),
                                              use_reentrant=self.reentrant)
        return self.head(h)


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_keeps_forward_order_and_finds_the_fault(reentrant):
    model = Checkpointed(reentrant)

    def corrupt(step, m, opt):
        if step == S:
            with torch.no_grad():
                m.block[0].weight.mul_(1000)

    with ndbg.watch(model, report=False) as run:
        _loop(model, STEPS, on_step_start=corrupt)
    assert run.trace.layer_names == ["stem", "block.0", "block.1", "block.2", "block.3",
                                     "head"]
    assert not np.isnan(run.trace.col("act_absmax")).any(), "the block is recorded"
    first = run.first_failure
    assert first is not None and (first.layer, first.step) == ("block.0", S), first


class SparseOut(nn.Module):
    """A layer of its own parameters that returns a sparse (COO) tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 16) * 0.4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.to_dense() @ self.weight).to_sparse()


class SparseModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sparse = SparseOut()
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.sparse(x).to_dense())


@pytest.mark.parametrize("sample_every", [1, 10])
def test_sparse_outputs_and_inputs_are_read_through_their_stored_values(sample_every):
    """PyTorch's reductions do not run on sparse tensors: a layer returning one, or a
    sparse batch, used to make the hook raise inside the user's forward. Their extremes
    are read from the stored values, and a fault in that layer is found there."""
    torch.manual_seed(0)
    model = SparseModel()
    seen: list[float] = []
    model.sparse.register_forward_hook(
        lambda m, a, y: seen.append(y.detach().to_dense().abs().max().item()))
    x, y = _batches(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ndbg.watch(model, report=False, sample_every=sample_every) as run:
        for step in range(STEPS):
            if step == S:
                with torch.no_grad():
                    model.sparse.weight.mul_(1000.0)
            opt.zero_grad()
            F.cross_entropy(model(x[step, :, :6].to_sparse()), y[step]).backward()
            opt.step()
    traced = run.trace.col("act_absmax")[:, run.trace.layer_names.index("sparse")]
    np.testing.assert_allclose(traced, seen, rtol=1e-6)
    assert np.isfinite(run.trace.scalar("in_absmax")).all()
    ff = run.first_failure
    assert ff is not None and (ff.step, ff.layer) == (S, "sparse"), ff
    assert run.inspect(ff)["weight"].shape == (6, 16)


# -- integer inputs -----------------------------------------------------------------------
def test_attentions_output_projection_is_part_of_the_attention_layer():
    """`nn.MultiheadAttention` never calls its `out_proj`: it passes its weights to a
    functional call. Listed alone it was a row without activations, numbered after every
    layer that runs; its weights are now the attention layer's, and a fault in them is
    found there."""
    setup = transformer()
    attention = "encoder.layers.0.self_attn"

    def corrupt(step, model, opt):
        if step == S:
            with torch.no_grad():
                model.get_submodule(attention).out_proj.weight.mul_(1000)

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, on_step_start=corrupt)
    names = run.trace.layer_names
    assert not [n for n in names if "out_proj" in n], names
    assert not np.isnan(run.trace.col("act_absmax")).all(axis=0).any(), "a row never ran"
    first = run.first_failure
    assert (first.step, first.layer) == (S, attention), first
    tensors = run.inspect(first).tensors
    assert "out_proj.weight" in tensors and "in_proj_weight" in tensors


def test_parametrized_weights_are_part_of_their_layer():
    """`spectral_norm` and `weight_norm` compute a layer's weight in modules of their own,
    called when the weight is read. Listed as layers, their "output" was the weight and
    the layer's gradient norm left it out; a NaN put into a parametrized weight was
    named after the parametrization. Now it is the layer's, found at its step."""
    from torch.nn.utils import parametrizations

    torch.manual_seed(0)
    model = nn.Sequential(parametrizations.spectral_norm(nn.Linear(6, 16)), nn.ReLU(),
                          parametrizations.weight_norm(nn.Linear(16, 2)))

    def corrupt(step, m, opt):
        if step == S:
            with torch.no_grad():
                m[0].parametrizations.weight.original[0, 0] = math.nan

    with ndbg.watch(model, report=False) as run:
        _loop(model, STEPS, on_step_start=corrupt)
    assert run.trace.layer_names == ["0", "1", "2"]
    assert np.isfinite(run.trace.col("grad_norm")[:S][:, [0, 2]]).all()
    first = run.first_failure
    assert (first.step, first.layer) == (S, "0"), first
    assert "parametrizations.weight.original" in run.inspect(first).tensors


def test_integer_inputs_embeddings():
    setup = transformer()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 40)
    assert run.trace.n_steps == 40
    in_max = run.trace.scalar("in_absmax")
    expected = [setup.batch(s)[0].max().item() for s in range(40)]
    np.testing.assert_array_equal(in_max, expected)
    assert not [e for e in run.events if e.kind == "data_anomaly"]
    _no_errors(run)


def test_integer_inputs_embedding_fault_is_found():
    setup = transformer()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, on_step_start=_scale_weight_at(setup.model, "emb", S))
    ff = run.first_failure
    assert (ff.step, ff.layer, ff.kind) == (S, "emb", "regime_shift"), ff.message


# -- frozen parameters, parameters outside the optimizer -------------------------------------
def test_frozen_parameters_are_not_vanishing():
    setup = mlp()
    model = setup.model
    for p in model[0].parameters():
        p.requires_grad_(False)
    with ndbg.watch(model, report=False) as run:
        losses = _loop_setup(setup, 120)
    assert losses[-10:].mean() < losses[:10].mean()
    _no_errors(run)
    assert not [e for e in run.events if e.layer == "0" and e.severity != "info"]
    names = run.trace.layer_names
    g = run.trace.col("grad_norm")[:, names.index("0")]
    assert np.isnan(g).all(), "a frozen layer has no gradient: not measured, not 0"
    assert np.isfinite(run.trace.col("act_absmax")[:, names.index("0")]).all()


def test_frozen_layer_fault_is_still_found():
    setup = mlp()
    for p in setup.model[0].parameters():
        p.requires_grad_(False)
    with ndbg.watch(setup.model, report=False) as run:
        _loop_setup(setup, STEPS, on_step_start=_scale_weight_at(setup.model, "0", S))
    ff = run.first_failure
    assert (ff.step, ff.layer) == (S, "0"), ff.message


@pytest.mark.parametrize("every", [10, 50])
def test_parameters_not_in_the_optimizer(every):
    """Layer 0 gets gradients but is in no optimizer: training goes on through the other
    layers, and the run says that layer 0 never moves (at the first sampled update that
    follows another update, the sampled step after step 0), and says nothing of the
    layers that train. However far apart the sampled steps are."""
    setup = mlp()
    model = setup.model
    opt = torch.optim.SGD(list(model[2].parameters()) + list(model[4].parameters()),
                          lr=0.05, momentum=0.9)
    before = model[0].weight.detach().clone()
    with ndbg.watch(model, report=False, sample_every=every) as run:
        losses = _loop_setup(setup, 120, opt=opt, zero=model.zero_grad)
    assert torch.equal(model[0].weight, before)
    assert losses[-10:].mean() < losses[:10].mean()
    assert run.trace.n_steps == 120
    _no_errors(run)
    names = run.trace.layer_names
    g = run.trace.col("grad_norm")[:, names.index("0")]
    assert np.isfinite(g).all() and (g > 0).all()
    (stuck,) = [e for e in run.events if e.kind == "weights_not_updated"]
    assert (stuck.layer, stuck.step, stuck.severity, stuck.end) == ("0", every, "warning", None)
    assert "not in the optimizer" in stuck.message


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
    says so at step 40, first for the first layer, with the cause. The same training in
    float32 (whose small updates still land) and bfloat16 at 1e-3 say nothing of it."""
    run, _ = _half_training(torch.bfloat16, 80, drop_at=40)
    _no_errors(run)
    rounded = [e for e in run.events if e.kind == "weights_not_updated"]
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
    refuses to narrow them to float32, and the watch stopped at step 0), every column is
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


def test_a_warm_up_from_a_learning_rate_of_zero_is_not_a_layer_left_out():
    """The first update of a warm-up at a learning rate of 0 moves nothing, and the
    next ones move the weights by very little: none of it is a layer out of the
    optimizer."""
    for arch in (mlp, cnn):
        setup = arch()
        opt = setup.make_opt(setup.model)
        warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 50))
        with ndbg.watch(setup.model, report=False) as run:
            train(setup, 40, opt=opt, after_update=lambda *_, w=warm: w.step())
        assert run.trace.scalar("lr")[0] == 0
        assert not [e for e in run.events if e.kind == "weights_not_updated"], arch


def test_a_replaced_optimizer_keeps_the_steps_counted():
    """A notebook re-runs the cell that makes the optimizer: the old one is gone, the new
    one's steps are the run's steps, and a fault after the switch is found there."""
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        _loop_setup(setup, 20)  # its optimizer is freed when the loop returns
        _loop_setup(setup, 40, on_step_start=_scale_weight_at(setup.model, setup.layers["mid"], 25))
    assert run.trace.n_steps == 60
    assert np.isfinite(run.trace.scalar("loss")).all()
    ff = run.first_failure
    assert (ff.step, ff.layer) == (45, setup.layers["mid"])


def _loop_setup(setup, steps, *, opt=None, on_step_start=None, zero=None):
    model = setup.model
    opt = opt if opt is not None else torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        if on_step_start is not None:
            on_step_start(step, model, opt)
        (zero or opt.zero_grad)()
        x, y = setup.batch(step)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


# -- AMP on the CPU -------------------------------------------------------------------------
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
    _no_errors(run)
    assert run.first_failure is None
    assert np.isfinite(run.trace.col("act_absmax")).all()


def test_amp_skipped_steps_are_not_a_failure():
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        real, scaler, _ = _amp_loop(setup, 80, skip_at=(40, 41, 42))
    assert real == 77, "the scaler should have skipped three steps"
    assert scaler.get_scale() == 65536.0 / 8
    # steps are optimizer steps: a skipped iteration is not a step of its own
    assert run.trace.n_steps == real
    _no_errors(run)
    assert run.first_failure is None
    assert np.isfinite(run.trace.col("grad_norm")[:, [0, 2, 4]]).all()


def test_amp_log_loss_records_the_unscaled_loss():
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        _, _, losses = _amp_loop(setup, 30, log_loss_to=run)
    recorded = run.trace.scalar("loss")
    np.testing.assert_allclose(recorded, torch.stack(losses).double().numpy(), rtol=1e-3)
    assert recorded.max() < 10  # not the scaled loss (x65536)


# -- torch.compile --------------------------------------------------------------------------
def _compile_works() -> str | None:
    try:
        f = torch.compile(lambda t: t * 2 + 1, backend="aot_eager")
        f(torch.ones(3))
    except Exception as exc:  # noqa: BLE001 - any failure means it cannot run here
        return f"{type(exc).__name__}: {exc}"
    return None


@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()"])
def test_compiled_model_trains_and_says_what_it_cannot_watch(how):
    """Compiled with the aot_eager backend: the same dynamo graph capture (where the hooks
    stop running) as the default inductor backend, without minutes of C++ compilation on
    two CPU cores. Training must go on unchanged, the run must carry a note if activations
    are not watched, and what the note says is watched must be recorded."""
    reason = _compile_works()
    if reason:
        pytest.skip(f"torch.compile cannot run on this machine: {reason}")
    torch._dynamo.reset()
    eager = mlp()
    eager_losses = _loop_setup(eager, 20)

    setup = mlp()
    if how == "model.compile()":
        setup.model.compile(backend="aot_eager")
        compiled = setup.model
    else:
        compiled = torch.compile(setup.model, backend="aot_eager")
    with _quiet(), ndbg.watch(compiled, report=False) as run:
        losses = _loop_setup(_with_model(setup, compiled), STEPS)
    torch.testing.assert_close(losses[:20], eager_losses, rtol=1e-5, atol=1e-6)
    assert run.trace.n_steps == STEPS
    assert leftover_global_hooks() == []
    acts = run.trace.col("act_absmax")
    if not np.isfinite(acts).any():
        assert any("compile" in n for n in run.notes), run.notes
    note = " ".join(run.notes)
    g = run.trace.col("grad_norm")
    assert np.isfinite(g[:, :3]).all() and (g[:, :3] > 0).all()
    assert np.isfinite(run.trace.scalar("loss")).all()
    says_unwatched = re.search(r"input batch[^.;]*\bnot\b|\bnot\b[^.;]*input batch", note)
    if not says_unwatched:
        assert np.isfinite(run.trace.scalar("in_absmax")).all(), (
            f"the input batch was not recorded, and the notes do not say so: {run.notes}")
    _no_errors(run)


@pytest.mark.skipif(not os.environ.get("NEURALDBG_SLOW_TESTS"),
                    reason="the default inductor backend compiles C++ for ~50 s on 2 CPU "
                           "cores (cold cache); set NEURALDBG_SLOW_TESTS=1 to run it. The "
                           "aot_eager tests cover the same hooks-under-dynamo behaviour.")
def test_compiled_model_default_backend():
    reason = _compile_works()
    if reason:
        pytest.skip(f"torch.compile cannot run on this machine: {reason}")
    torch._dynamo.reset()
    eager_losses = _loop_setup(mlp(), 20)
    setup = mlp()
    compiled = torch.compile(setup.model)
    with _quiet(), ndbg.watch(compiled, report=False) as run:
        losses = _loop_setup(_with_model(setup, compiled), 20)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-4, atol=1e-5)
    assert run.trace.n_steps == 20
    if not np.isfinite(run.trace.col("act_absmax")).any():
        assert any("compile" in n for n in run.notes), run.notes
    assert np.isfinite(run.trace.scalar("in_absmax")).all()
    assert leftover_global_hooks() == []
    _no_errors(run)


@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()"])
def test_compiled_model_bad_batch_is_found(how):
    reason = _compile_works()
    if reason:
        pytest.skip(f"torch.compile cannot run on this machine: {reason}")
    torch._dynamo.reset()
    setup = mlp()
    if how == "model.compile()":
        setup.model.compile(backend="aot_eager")
        compiled = setup.model
    else:
        compiled = torch.compile(setup.model, backend="aot_eager")

    def on_batch(step, x):
        if step == S:
            x = x.clone()
            x[0, 0] = float("nan")
        return x
    with _quiet(), ndbg.watch(compiled, report=False) as run:
        train(_with_model(setup, compiled), STEPS, on_batch=on_batch)
    ff = run.first_failure
    assert ff is not None
    assert (ff.step, ff.layer, ff.kind) == (S, None, "data_anomaly"), ff.message


class _quiet:
    """torch warns that global module hooks fire once more for the OptimizedModule."""

    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.filterwarnings("ignore", message=".*torch.compile.*global hooks.*")

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def _with_model(setup, model):
    from dataclasses import replace
    return replace(setup, model=model)


# -- data-parallel wrappers ----------------------------------------------------------------
def test_a_data_parallel_model_is_watched_under_its_own_layer_names():
    """`nn.DataParallel` (on the CPU it calls the model as it is; the same unwrapping
    serves DistributedDataParallel, `tests/test_distributed.py`): the same losses as the
    plain model, layers named as in the model ("2", not "module.2"), and a weight blown
    up at a known step found at that layer and step."""
    plain = _loop_setup(mlp(), S)  # the steps before the fault
    setup = mlp()
    wrapped = nn.DataParallel(setup.model)
    with ndbg.watch(wrapped, report=False) as run:
        losses = _loop_setup(_with_model(setup, wrapped), STEPS,
                             on_step_start=_scale_weight_at(setup.model, "2", S))
    assert torch.equal(losses[:S], plain[:S])
    assert [layer.name for layer in run.trace.layers] == ["0", "1", "2", "3", "4"]
    ff = run.first_failure
    assert (ff.layer, ff.step) == ("2", S), ff


# -- watch() without a model ------------------------------------------------------------
def test_watch_without_a_model_finds_the_same_failure():
    def faulty_run(with_model: bool):
        setup = mlp()
        # overhead=None: statistics every 10 steps, not by wall time, so the two runs
        # record the same trace and can be compared event by event
        kw = {"report": False, "overhead": None}
        w = ndbg.watch(setup.model, **kw) if with_model else ndbg.watch(**kw)
        with w as run:
            train(setup, STEPS, on_step_start=_scale_weight_at(setup.model, "2", S))
        return run

    given, found = faulty_run(True), faulty_run(False)
    assert found.trace.n_steps == STEPS
    assert found.trace.layer_names == given.trace.layer_names
    assert np.isfinite(found.trace.scalar("in_absmax")).all()
    ff = found.first_failure
    assert (ff.step, ff.layer, ff.kind) == (S, "2", "regime_shift"), ff.message
    assert [(e.step, e.layer, e.kind) for e in found.events] == \
           [(e.step, e.layer, e.kind) for e in given.events]


def test_watch_without_a_model_leaves_out_a_teacher_run_without_gradients():
    """Distillation: a frozen teacher called under no_grad trains nothing, so `watch()`
    without a model finds the student alone, and its fault where it is."""
    setup = mlp()
    torch.manual_seed(1)
    teacher = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))

    def distil(logits, y):
        with torch.no_grad():
            soft = teacher(setup.batch(len(seen))[0]).softmax(1)
        seen.append(1)
        return F.cross_entropy(logits, y) + F.cross_entropy(logits, soft)

    seen: list[int] = []
    setup.loss_fn = distil
    with ndbg.watch(report=False) as run:
        train(setup, STEPS, on_step_start=_scale_weight_at(setup.model, "2", S))
    assert run.trace.layer_names == ["0", "1", "2", "3", "4"], "the student alone"
    ff = run.first_failure
    assert (ff.step, ff.layer) == (S, "2"), ff.message


def test_checkpointing_a_whole_model_records_its_recomputation():
    """Reentrant checkpointing of the whole model calls it first with gradients off (left
    out, as an evaluation) and again in the backward, with them: that call is recorded,
    its batch included."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    x, y = _batches()
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
    assert not np.isnan(run.trace.col("act_absmax")).any()
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
    closes after it, so each row holds its own step (before, every row held the step
    before it: the first one no loss, a bad batch one step late)."""
    runs = []
    for closure in (False, True):
        setup = mlp()
        opt = torch.optim.SGD(setup.model.parameters(), lr=0.05, momentum=0.9)
        runs.append(_closure_run(setup, opt, closure=closure, fault=S, keyword=keyword))
    plain, closed = runs
    for col in ("act_absmax", "act_mean", "grad_norm", "param_norm", "update_ratio"):
        np.testing.assert_array_equal(closed.trace.col(col), plain.trace.col(col), col)
    for col in ("loss", "in_absmax", "lr"):
        np.testing.assert_array_equal(closed.trace.scalar(col), plain.trace.scalar(col), col)
    ff = closed.first_failure
    assert (ff.step, ff.kind) == (S, "data_anomaly"), ff.message
    assert [str(e) for e in closed.events] == [str(e) for e in plain.events]


def test_lbfgs_records_each_step_in_its_own_row():
    setup = mlp()
    opt = torch.optim.LBFGS(setup.model.parameters(), lr=0.05, max_iter=4)
    run = _closure_run(setup, opt, closure=True, fault=S)
    assert run.trace.n_steps == STEPS
    assert np.isfinite(run.trace.scalar("loss")).all()
    in_absmax = run.trace.scalar("in_absmax")
    assert in_absmax.argmax() == S and in_absmax[S] > 100 * in_absmax[S - 1]
    assert any((e.step, e.kind) == (S, "data_anomaly") for e in run.events)


# -- user errors ------------------------------------------------------------------------------
def test_watch_of_a_string_is_a_type_error_naming_the_fix():
    with pytest.raises(TypeError) as info:
        ndbg.watch("not a model")
    msg = str(info.value)
    assert "nn.Module" in msg and "str" in msg
    assert "Pass the model" in msg
    assert leftover_global_hooks() == []


def test_watch_of_parameters_or_an_output_is_a_type_error():
    model = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="parameters"):
        ndbg.watch(model.parameters())
    with pytest.raises(TypeError, match="output"):
        ndbg.watch(model(torch.randn(4, 3)))
    assert leftover_global_hooks() == []


def test_unknown_threshold_names_get_a_spelling_hint():
    model = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="Did you mean 'vanish'"):
        ndbg.watch(model, vanihs=1e-7)
    with pytest.raises(TypeError, match="Did you mean 'jump_error'"):
        ndbg.Thresholds().with_(jump_eror=50)
    with pytest.raises(ValueError, match="stop_on"):
        ndbg.watch(model, stop_on="errors")
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 5)
    with pytest.raises(TypeError, match="Did you mean 'window'"):
        run.reclassify(windw=5)
    assert leftover_global_hooks() == []


def test_torch_func_transforms_of_the_model_are_left_out_not_a_crash():
    """Per-sample gradients (DP-SGD: `vmap(grad(functional_call(model)))`) and a Jacobian
    penalty (`torch.func.jacrev` of the model inside a normal training step): under the
    transforms the hooks see wrapped tensors, where reading one on the host raised and
    the watch stopped at step 0. Those calls are left out and said so; the plain forward
    of the same step is recorded, and a fault in it is still found."""
    from torch.func import functional_call, grad, jacrev, vmap

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 20, generator=gen), torch.randint(0, 2, (64,), generator=gen)

    def sample_loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))
    with ndbg.watch(model, report=False) as run:
        for _ in range(15):  # DP-SGD: the gradients are set by hand
            params = {k: v.detach() for k, v in model.named_parameters()}
            g = per_sample(params, x, y)
            for k, p in model.named_parameters():
                p.grad = g[k].mean(0)
            opt.step()
    assert run.status == "finished" and run.trace.n_steps == 15
    assert not any("stopped" in n for n in run.notes), run.notes
    assert any("torch.func" in n for n in run.notes), run.notes
    assert np.isfinite(run.trace.col("grad_norm")).all()

    with ndbg.watch(model, report=False) as run:
        for step in range(40):  # a Jacobian penalty beside the loss; a fault at step 30
            if step == 30:
                with torch.no_grad():
                    model[2].weight.mul_(1000.0)
            opt.zero_grad()
            jac = jacrev(lambda v: model(v[None])[0])(x[0])
            loss = F.cross_entropy(model(x), y) + 1e-3 * jac.pow(2).sum()
            loss.backward()
            opt.step()
    assert run.status == "finished" and not any("stopped" in n for n in run.notes)
    assert np.isfinite(run.trace.col("act_absmax")).all()
    ff = run.first_failure
    assert ff is not None and (ff.layer, ff.step) == ("2", 30), ff


@pytest.mark.parametrize("frozen", [True, False])
def test_a_loop_that_optimises_the_models_input_is_watched_step_by_step(frozen):
    """Style transfer, feature visualisation, adversarial examples: the optimizer trains
    the image fed to the model, not the model. The block was recorded as one step, with
    the advice to make the optimizer again from the model. Its steps are the watch's
    steps, the image is not judged as data (optimised from all zeros, it was "an input
    batch of zeros"), and a model that keeps its weights trainable is told that they are
    not updated."""
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
    assert np.isfinite(run.trace.col("act_absmax")).all()
    _no_errors(run)
    loud = {(e.kind, e.severity) for e in run.events if e.severity != "info"}
    assert loud == (set() if frozen else {("weights_not_updated", "warning")}), loud
    assert np.isnan(run.trace.scalar("in_absmax")).all()  # what trains is not data


def test_an_optimizer_stepped_twice_per_backward_is_a_warning_where_it_began():
    """`opt.step()` called a second time after one backward, from batch 30 on: the same
    gradients applied twice. Nothing else saw it (every other step had no loss, and the
    gradients were never "carried" two steps in a row)."""
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


def test_a_layer_frozen_in_mid_run_is_said():
    """`requires_grad_(False)` on a layer at step 30 (a bug, or progressive freezing): its
    gradient and weight columns went empty and nothing was said. An info event at that
    step names it; the training is otherwise healthy."""
    setup = mlp()
    mid = setup.layers["mid"]
    opt = setup.make_opt(setup.model)

    def freeze(step, model, opt):
        if step == 30:
            module = dict(model.named_modules())[mid]
            module.requires_grad_(False)

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 60, opt=opt, on_step_start=freeze)
    frozen = [e for e in run.events if e.signal == "frozen"]
    assert [(e.layer, e.step, e.severity) for e in frozen] == [(mid, 30, "info")], run.events
    _no_errors(run)
