"""Optimizer updates in real trainings: weights shrinking under a weight decay far too
strong, weights zeroed in place (`exploding_update`), and weights the optimizer does not
move (`weights_not_updated`): a layer in no optimizer, and what is not one, a warm-up from
a learning rate of 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from faults import STEPS, S
from loops import setup_loop
from models import FACTORIES, cnn, mlp, train, weight_of

import neuraldbg_nb as ndbg


def test_a_weight_decay_set_far_too_strong_is_the_weights_shrinking():
    """AdamW's weight decay set to 500 at step 40 (a typo for 5e-4): every update halves
    the weights, each below the exploding-update line (0.5x of their size), and the
    activations collapse after them. The weights' shrinking is named, within a few steps
    of the typo."""
    setup = FACTORIES["mlp"]()
    opt = torch.optim.AdamW(setup.model.parameters(), lr=1e-3, weight_decay=0.01)

    def typo(step, model, opt):
        if step == S:
            for g in opt.param_groups:
                g["weight_decay"] = 500.0

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, opt=opt, on_step_start=typo)
    shrink = [e for e in run.events if e.signal == "shrink"]
    assert shrink and {e.severity for e in shrink} == {"warning"}
    assert all(S <= e.step <= S + 4 for e in shrink), [str(e) for e in shrink]
    assert setup.layers["mid"] in {e.layer for e in shrink}


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_weights_zeroed_in_place_with_their_bias_kept_are_the_first_failure(arch):
    """A layer's weights zeroed between two steps, its bias kept (a bad checkpoint merge,
    a pruning bug): its output is the bias alone. The norm's fall in one update is below
    any growth line (a difference of norms reads at most 1x the weights' size), so a
    growth rule alone would leave warnings and no first failure (the next layer's
    activations collapsing). A fall of 5x or more is an error and the layer's own change."""
    setup = FACTORIES[arch]()
    layer = setup.layers["mid"]

    def hit(step, model, opt):
        if step == S:
            with torch.no_grad():
                weight_of(model, layer).zero_()

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, on_step_start=hit)
    early = [str(e) for e in run.events if e.severity != "info" and e.step < S]
    assert not early, early
    ff = run.first_failure
    assert ff is not None and (ff.layer, ff.step) == (layer, S), str(run)
    if arch == "mlp":  # 4.38 -> 0.808; the next layer's activations collapsed 29x
        assert (ff.signal, ff.severity) == ("collapse", "error"), str(run)
        assert f"weights lost 82% of their size during step {S}" in ff.message
    else:  # behind a BatchNorm: a gradient that blows up, and an update 274x the weights
        assert ff.kind == "regime_shift", str(run)


@pytest.mark.parametrize("every", [10, 50])
def test_parameters_not_in_the_optimizer(every):
    """Layer 0 gets gradients but is in no optimizer: training goes on through the other
    layers. Read from the optimizer's groups, it is an error at step 0 naming layer 0
    (`not_in_optimizer`), however far apart the sampled steps are; its weights never
    moving is said as well (at the first sampled update that follows another update, the
    sampled step after step 0), and nothing of the layers that train."""
    setup = mlp()
    model = setup.model
    opt = torch.optim.SGD(list(model[2].parameters()) + list(model[4].parameters()),
                          lr=0.05, momentum=0.9)
    before = model[0].weight.detach().clone()
    with ndbg.watch(model, report=False, sample_every=every) as run:
        losses = setup_loop(setup, 120, opt=opt, zero=model.zero_grad)
    assert torch.equal(model[0].weight, before)
    assert losses[-10:].mean() < losses[:10].mean()
    assert run.trace.n_steps == 120
    first = run.first_failure
    assert (first.kind, first.layer, first.step) == ("not_in_optimizer", "0", 0), first
    assert [e.layer for e in run.events if e.severity == "error"] == ["0"]
    names = run.trace.layer_names
    g = run.trace.col("grad_norm")[:, names.index("0")]
    assert np.isfinite(g).all() and (g > 0).all()
    (stuck,) = [e for e in run.events if e.kind == "weights_not_updated"]
    assert (stuck.layer, stuck.step, stuck.severity, stuck.end) == ("0", every, "warning", None)
    assert "not in the optimizer" in stuck.message


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


def _tanh_mlp_on_task(lr: float, steps: int = 40):
    """A tanh MLP trained with SGD at learning rate `lr`; its run and its losses."""
    from loops import task_batches

    x, y = task_batches()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 5))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for step in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[step]), y[step])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return run, np.array(losses)


def test_a_learning_rate_far_too_high_diverges_within_the_first_steps_and_is_named():
    """SGD at a learning rate of 20 on a task its healthy twin learns at 0.1: the loss
    leaves its first value by 10x and more within a few steps, before the loss has a
    recent level of its own to jump from, then swings up there. An error at the step it
    first stood 10x above where it began (held 3 steps), and the first failure at or
    before it, with the learning rate in its sentence."""
    run, losses = _tanh_mlp_on_task(20.0)
    above = np.flatnonzero(losses >= 10 * losses[0])
    assert len(above) and above[0] < 10, losses
    diverged = next(e for e in run.events if e.signal == "loss_start")
    assert (diverged.kind, diverged.severity) == ("loss_divergence", "error")
    assert diverged.step == above[0], (diverged.step, losses[:10])
    assert "its first value" in diverged.message
    first = run.first_failure
    assert first is not None and first.step <= diverged.step, first
    assert first is diverged or "learning rate" in first.message, first.message
    healthy, _ = _tanh_mlp_on_task(0.1)
    assert not [e for e in healthy.events if e.severity == "error"], \
        [str(e) for e in healthy.events]


@pytest.mark.parametrize("at", [S, S + 3])
def test_an_edit_that_moves_its_layer_little_but_kills_the_next_is_that_layers(at):
    """A bias set to -20 outside the optimizer: the layer's own outputs move about 3x
    (no jump of their own) while every unit of the ReLU after it dies and the next
    layer's outputs collapse. The edit is the first failure, at its layer and step,
    whether the step's layers were measured or the step was replayed."""
    from loops import relu_mlp, task_loop

    def edit(step, model, opt):
        if step == at:
            with torch.no_grad():
                model[0].bias.fill_(-20.0)

    model = relu_mlp()
    with ndbg.watch(model, report=False) as run:
        task_loop(model, STEPS, on_step_start=edit)
    first = run.first_failure
    assert first is not None and (first.layer, first.step) == ("0", at), \
        [str(e) for e in run.events[:5]]
    assert "outside the optimizer" in first.message
