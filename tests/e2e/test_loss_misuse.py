"""Losses given inputs of the wrong form, in real training: cross-entropy on a softmax's
probabilities or on a ReLU's outputs, `binary_cross_entropy_with_logits` on a sigmoid's,
an MSE whose [N, 1]
prediction meets an [N] target. Each trains, its loss moves, and each is the first
failure at the step it is first read at (step 0, and the first sampled step after a loss
that turns wrong later); the same losses built right, and the losses that take
probabilities by design (BCE on a sigmoid, a distillation's KL against a teacher's
softmax), are quiet. Losses are the same with and without the watch."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loops import task_batches
from torch import nn

import neuraldbg_nb as ndbg

STEPS = 40


def _model(head: nn.Module | None, out: int = 2) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, out)]
    return nn.Sequential(*layers, *([head] if head is not None else []))


def _softmax_ce(model, x, y, step):
    return nn.CrossEntropyLoss()(model(x), y)


def _sigmoid_bce_logits(model, x, y, step):
    return F.binary_cross_entropy_with_logits(model(x), y.float()[:, None])


def _bce(model, x, y, step):
    return F.binary_cross_entropy(model(x), y.float()[:, None])


def _mse_broadcast(model, x, y, step):
    return F.mse_loss(model(x), x[:, 0] + x[:, 1])


def _mse(model, x, y, step):
    return F.mse_loss(model(x).squeeze(-1), x[:, 0] + x[:, 1])


@functools.cache
def _teacher() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))


def _distill(model, x, y, step):
    with torch.no_grad():
        soft = torch.softmax(_teacher()(x), dim=1)
    return F.kl_div(F.log_softmax(model(x), dim=1), soft, reduction="batchmean")


def _train(model, loss_of, watched: bool = True, steps: int = STEPS):
    x, y = task_batches()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []

    def loop():
        for step in range(steps):
            opt.zero_grad()
            loss = loss_of(model, x[step], y[step], step)
            loss.backward()
            opt.step()
            losses.append(loss.item())

    if not watched:
        loop()
        return None, losses
    with ndbg.watch(model, report=False) as run:
        loop()
    return run, losses


BUGS = {
    "softmax": (lambda: _model(nn.Softmax(dim=1)), _softmax_ce, "squashed", "log-softmax"),
    "sigmoid": (lambda: _model(nn.Sigmoid(), out=1), _sigmoid_bce_logits, "squashed",
                "sigmoid's output"),
    "relu": (lambda: _model(nn.ReLU()), _softmax_ce, "squashed", "logits from a ReLU"),
    "broadcast": (lambda: _model(None, out=1), _mse_broadcast, "broadcast", "with 32 targets"),
}


@pytest.mark.parametrize("bug", list(BUGS))
@pytest.mark.filterwarnings("ignore:Using a target size")
def test_a_loss_given_inputs_of_the_wrong_form_is_the_first_failure_at_step_0(bug):
    make, loss_of, signal, words = BUGS[bug]
    run, losses = _train(make(), loss_of)
    first = run.first_failure
    assert first is not None, [str(e) for e in run.events]
    assert (first.kind, first.step, first.layer, first.signal) == ("loss_misuse", 0, None,
                                                                   signal), str(first)
    assert words in first.message, first.message
    _, plain = _train(make(), loss_of, watched=False)
    assert losses == plain


HEALTHY = {
    "logits": (lambda: _model(None), _softmax_ce),
    "bce on a sigmoid": (lambda: _model(nn.Sigmoid(), out=1), _bce),
    "bce with logits": (lambda: _model(None, out=1), _sigmoid_bce_logits),
    "mse": (lambda: _model(None, out=1), _mse),
    "distillation": (lambda: _model(None), _distill),
}


@pytest.mark.parametrize("case", list(HEALTHY))
def test_losses_built_right_are_quiet(case):
    make, loss_of = HEALTHY[case]
    run, _ = _train(make(), loss_of)
    assert not [e for e in run.events if e.kind == "loss_misuse"], [str(e) for e in run.events]
    assert not [e for e in run.events if e.severity == "error"], [str(e) for e in run.events]


def test_a_loss_that_turns_wrong_later_is_named_at_the_first_sampled_step_after():
    """The loss's graph is read on sampled steps: a softmax added at step 20 is named at
    the first one from there."""
    at = 20

    def loss_of(model, x, y, step):
        out = model(x)
        return F.cross_entropy(torch.softmax(out, 1) if step >= at else out, y)

    run, _ = _train(_model(None), loss_of, steps=60)
    sampled = np.flatnonzero(run.trace.scalar("sampled") > 0)
    expected = int(sampled[sampled >= at][0])
    (bad,) = [e for e in run.events if e.kind == "loss_misuse"]
    assert (bad.step, bad.signal) == (expected, "squashed"), (str(bad), sampled)
    assert expected - at < 20, sampled


def _chance_run(labels_apart: bool = False, clip: float | None = None, steps: int = 70):
    """A classifier whose labels are drawn apart from its inputs, or whose gradients are
    clipped to `clip`, under a `chance_steps` of 25."""
    x, y = task_batches()
    if labels_apart:
        y = torch.randint(0, 2, y.shape, generator=torch.Generator().manual_seed(3))
    model = _model(None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with ndbg.watch(model, report=False, chance_steps=25) as run:
        for step in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x[step]), y[step]).backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
            opt.step()
    return run


@pytest.mark.parametrize("labels_apart, clip, words", [
    (True, None, "label belongs to its input"), (False, 1e-5, "clipped to it")])
def test_a_model_that_learns_nothing_is_named_once_its_loss_held_at_chance(
        labels_apart, clip, words):
    run = _chance_run(labels_apart, clip)
    found = [e for e in run.events if e.kind == "loss_at_chance"]
    assert [(e.step, e.severity) for e in found] == [(24, "warning"), (49, "error")], \
        [str(e) for e in run.events]
    assert "C = 2 classes" in found[0].message and words in found[0].message
    first = run.first_failure
    assert first is not None and first.kind == "loss_at_chance", str(first)


def _imbalanced_run(learnable: bool, steps: int = 80):
    """Four classes, one of them 70% of the labels; fresh inputs at every step (nothing
    to memorise). The labels follow the inputs (`learnable`) or are drawn apart from
    them, under a `chance_steps` of 25."""
    g = torch.Generator().manual_seed(5)
    teacher = torch.randn(6, 4, generator=g)
    model = _model(None, out=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with ndbg.watch(model, report=False, chance_steps=25) as run:
        for _ in range(steps):
            x = torch.randn(128, 6, generator=g)
            if learnable:  # class 0 where no other class's score is high
                scores = x @ teacher
                y = torch.where(scores[:, 1:].max(1).values > 1.2, scores[:, 1:].argmax(1) + 1, 0)
            else:
                y = torch.multinomial(torch.tensor([0.7, 0.1, 0.1, 0.1]), 128,
                                      replacement=True, generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return run


def test_labels_apart_from_inputs_with_one_class_most_of_them_are_at_chance():
    """A model that learns nothing predicts the classes' frequencies: its loss settles
    at their entropy (0.94 for 70/10/10/10), well under ln 4, which is where it is
    named; the sentence says chance is that level. Labels the inputs decide, with the
    same imbalance, leave it and stay quiet."""
    run = _imbalanced_run(learnable=False)
    found = [e for e in run.events if e.kind == "loss_at_chance"]
    assert [e.severity for e in found] == ["warning", "error"], [str(e) for e in run.events]
    assert "the classes are not balanced" in found[0].message
    level = run.trace.scalar("loss_chance")
    assert 0.85 < np.nanmedian(level) < 1.05 < math.log(4)
    quiet = _imbalanced_run(learnable=True)
    assert not [e for e in quiet.events if e.kind == "loss_at_chance"], \
        [str(e) for e in quiet.events]


def test_a_model_that_learns_its_labels_leaves_chance_and_is_quiet():
    run = _chance_run()
    assert not [e for e in run.events if e.kind == "loss_at_chance"]
    assert not [e for e in run.events if e.severity == "error"], [str(e) for e in run.events]
