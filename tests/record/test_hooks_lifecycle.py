"""Hooks come and go with the `with` block, on every way out; steps are counted right for
nested watches, re-entered watches, gradient accumulation, loops without an optimizer and
loops with two optimizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ORIGINAL_BACKWARD, leftover_global_hooks, leftover_module_hooks
from models import measured, mlp, train
from torch import nn

import neuraldbg_nb as ndbg


def _assert_unhooked(model: nn.Module) -> None:
    assert leftover_global_hooks() == []
    assert leftover_module_hooks(model) == []
    assert torch.autograd.backward is ORIGINAL_BACKWARD


def _assert_hooked(model: nn.Module) -> None:
    """Inside a block: the probe's hooks are there (so the checks above can fail). With a
    model given, forward hooks sit on its layers and no global module hook is added."""
    left = leftover_global_hooks()
    assert not any("forward" in x for x in left), left
    assert any("optimizer" in x for x in left), left
    assert any("_forward_hooks" in x for x in leftover_module_hooks(model))
    assert torch.autograd.backward is not ORIGINAL_BACKWARD


# -- every way out of the block -----------------------------------------------------------
def test_hooks_removed_after_normal_exit():
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 5)
        _assert_hooked(setup.model)
    _assert_unhooked(setup.model)
    assert run.status == "finished"
    assert run.trace.n_steps == 5


def test_hooks_removed_after_an_exception_in_the_block():
    setup = mlp()
    with pytest.raises(ValueError, match="boom"), ndbg.watch(setup.model, report=False) as run:
        train(setup, 5)
        raise ValueError("boom")
    _assert_unhooked(setup.model)
    assert run.status == "raised"
    assert isinstance(run.exception, ValueError)
    assert run.trace.n_steps == 5


def test_hooks_removed_after_keyboard_interrupt():
    setup = mlp()

    def interrupt(step, model, opt):
        if step == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), ndbg.watch(setup.model, report=False) as run:
        train(setup, 20, on_step_start=interrupt)
    _assert_unhooked(setup.model)
    assert run.status == "interrupted"
    assert run.trace.n_steps == 7


def test_a_watch_in_a_generator_its_consumer_stops_early_is_a_finished_run():
    """A training written as a generator (it yields each step's loss) whose consumer
    stops early with `break`: the generator is closed, the watch ends as a normal finish
    (not an exception), and its hooks are gone."""
    setup = mlp()
    runs = []

    def steps():
        with ndbg.watch(setup.model, report=False) as run:
            runs.append(run)
            for step in range(100):
                train(setup, 1)
                yield step

    for step in steps():
        if step == 6:
            break
    (run,) = runs
    _assert_unhooked(setup.model)
    assert run.status == "finished" and run.exception is None
    assert run.trace.n_steps == 7


def test_exception_in_the_middle_of_a_forward_leaves_nothing_behind():
    """A forward that raises half way (after some hooks ran, before the root's post hook)
    must not leave state that spoils the next watch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
    with pytest.raises(RuntimeError), ndbg.watch(model, report=False):
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        model(torch.randn(16, 5))  # shape error inside the first Linear
    _assert_unhooked(model)
    with ndbg.watch(model, report=False) as run:
        for _ in range(4):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert run.trace.n_steps == 4
    # the input batch is recorded every step (the root's call depth was reset)
    assert np.isfinite(run.trace.scalar("in_absmax")).all()
    assert run.trace.scalar("in_absmax")[0] == pytest.approx(x.abs().max().item())


# -- nesting and re-entering --------------------------------------------------------------
def test_nested_watches_each_count_their_own_steps():
    setup = mlp()
    opt = setup.make_opt(setup.model)
    losses: list[torch.Tensor] = []
    with ndbg.watch(setup.model, report=False) as outer:
        train(setup, 10, opt=opt, losses=losses)
        with ndbg.watch(setup.model, report=False) as inner:
            train(setup, 20, opt=opt, losses=losses)
        assert torch.autograd.backward is not ORIGINAL_BACKWARD  # the outer still hears
        train(setup, 10, opt=opt, losses=losses)
    _assert_unhooked(setup.model)
    assert outer.trace.n_steps == 40
    assert inner.trace.n_steps == 20
    assert inner.trace.layer_names == outer.trace.layer_names
    expected = torch.stack(losses).double().numpy()
    np.testing.assert_allclose(outer.trace.scalar("loss"), expected, rtol=1e-6)
    np.testing.assert_allclose(inner.trace.scalar("loss"), expected[10:30], rtol=1e-6)
    np.testing.assert_array_equal(inner.trace.col("grad_norm"),
                                  outer.trace.col("grad_norm")[10:30])
    both = (inner.trace.scalar("hooked") == 1) & (outer.trace.scalar("hooked")[10:30] == 1)
    assert both.any()  # each hooks the steps of its own count: where both did, the same
    np.testing.assert_array_equal(inner.trace.col("act_absmax")[both],
                                  outer.trace.col("act_absmax")[10:30][both])
    np.testing.assert_array_equal(inner.trace.scalar("in_absmax"),
                                  outer.trace.scalar("in_absmax")[10:30])


def test_reentering_the_same_watch_continues_the_run():
    setup = mlp()
    opt = setup.make_opt(setup.model)
    w = ndbg.watch(setup.model, report=False)
    with w as first:
        train(setup, 10, opt=opt)
        with pytest.raises(RuntimeError), w:
            pass
    _assert_unhooked(setup.model)
    assert first.status == "finished"
    with w as second:
        train(setup, 15, opt=opt)
    _assert_unhooked(setup.model)
    assert second is first
    assert first.trace.n_steps == 25
    assert np.isfinite(first.trace.scalar("loss")).all()
    assert first.detection.steps_done == 25


# -- what a step is -----------------------------------------------------------------------
def test_gradient_accumulation_is_one_step_per_optimizer_step():
    setup = mlp()
    model, opt = setup.model, setup.make_opt(setup.model)
    micro_losses, grad_norms = [], []
    with ndbg.watch(model, report=False) as run:
        for step in range(15):
            opt.zero_grad()
            step_losses = []
            for micro in range(4):
                x, y = setup.batch(step * 4 + micro)
                loss = F.cross_entropy(model(x), y)
                (loss / 4).backward()
                step_losses.append(loss.detach() / 4)
            micro_losses.append(torch.stack(step_losses))
            first = model[0]
            grad_norms.append(torch.sqrt(first.weight.grad.pow(2).sum()
                                         + first.bias.grad.pow(2).sum()).item())
            opt.step()
    assert run.trace.n_steps == 15
    # the grad norm of the accumulated gradient, weight and bias together
    np.testing.assert_allclose(run.trace.col("grad_norm")[:, 0], grad_norms, rtol=1e-4)
    # the recorded loss is a per-step summary of the 4 backward roots
    recorded = run.trace.scalar("loss")
    per_step = torch.stack(micro_losses).double()
    assert np.all(recorded >= per_step.min(1).values.numpy() - 1e-6)
    assert np.all(recorded <= per_step.max(1).values.numpy() + 1e-6)
    assert not [e for e in run.events if e.kind == "data_anomaly"]


def test_loop_without_optimizer_counts_run_step_calls():
    setup = mlp()
    model = setup.model
    with ndbg.watch(model, report=False) as run:
        for step in range(30):
            model.zero_grad()
            x, y = setup.batch(step)
            F.cross_entropy(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.05 * p.grad
            run.step()
    assert run.trace.n_steps == 30
    g = run.trace.col("grad_norm")
    assert np.isfinite(g[:, 0]).all() and (g[:, 0] > 0).all()
    assert np.isfinite(run.trace.scalar("loss")).all()
    assert run.first_failure is None
    with pytest.raises(RuntimeError):
        run.step()  # outside the block


def test_loop_without_optimizer_or_step_calls_is_one_step_with_a_warning():
    setup = mlp()
    w = ndbg.watch(setup.model, report=False)
    with pytest.warns(UserWarning, match="run.step"):  # noqa: PT031, SIM117 - warned at exit
        with w as run:
            for step in range(3):
                x, y = setup.batch(step)
                F.cross_entropy(setup.model(x), y).backward()
    assert run.trace.n_steps == 1
    assert str(run).startswith("neuraldbg: no optimizer step was seen, so the block was not "
                               "judged step by step (see the note)."), str(run)


def test_an_optimizer_made_for_an_earlier_copy_of_the_model_is_named_as_the_cause(tmp_path):
    """A notebook runs the model's cell again after the optimizer's: the optimizer trains
    the earlier copy's parameters, and the watched model never changes. The run names
    that optimizer as the cause, rather than saying that no optimizer step was seen and
    asking for run.step() calls."""
    setup = mlp()
    stale = torch.optim.SGD(mlp().model.parameters(), lr=0.05)  # the earlier copy's
    before = [p.detach().clone() for p in setup.model.parameters()]
    w = ndbg.watch(setup.model, report=False)
    with pytest.warns(UserWarning, match="an earlier copy of this model"):  # noqa: PT031, SIM117
        with w as run:
            for step in range(5):
                x, y = setup.batch(step)
                stale.zero_grad()
                F.cross_entropy(setup.model(x), y).backward()
                stale.step()
    assert all(torch.equal(a, p) for a, p in zip(before, setup.model.parameters()))
    assert run.trace.n_steps == 1
    (note,) = run.notes
    assert "stepped 5 times" in note and "model.parameters()" in note, note
    assert note in str(run)
    headline = ("neuraldbg: the model did not train: the optimizer that stepped trains none "
                "of its parameters (see the note).")
    assert str(run).startswith(headline), str(run)
    assert str(run.reclassify(jump=50)).startswith(headline)
    assert str(ndbg.load(run.save(tmp_path / "stale"))).startswith(headline)


def _gan(seed: int = 0):
    torch.manual_seed(seed)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    return G, D


def _gan_loop(G, D, iterations: int, bad_lr: tuple[str, int] | None = None,
              bad_weight: int | None = None, bad_real: int | None = None) -> None:
    """A GAN's loop: the discriminator's step, then the generator's. `bad_lr`: ("G" or
    "D", step) whose optimizer's learning rate becomes 100 at that step; `bad_weight`:
    the step at which the generator's last weight is scaled by 1e4; `bad_real`: the step
    whose real batch is scaled by 1000."""
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    gen = torch.Generator().manual_seed(7)
    bce = F.binary_cross_entropy_with_logits
    for step in range(iterations):
        if bad_lr is not None and step == bad_lr[1]:
            for group in (opt_g if bad_lr[0] == "G" else opt_d).param_groups:
                group["lr"] = 100.0
        if step == bad_weight:
            with torch.no_grad():
                G[2].weight.mul_(1e4)
        real = torch.randn(32, 2, generator=gen) * 0.5 + torch.tensor([2.0, -1.0])
        if step == bad_real:
            real = real * 1000
        z = torch.randn(32, 4, generator=gen)
        opt_d.zero_grad()
        fake = G(z).detach()
        loss_d = bce(D(real), torch.ones(32, 1)) + bce(D(fake), torch.zeros(32, 1))
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_g = bce(D(G(z)), torch.ones(32, 1))
        loss_g.backward()
        opt_g.step()


def test_two_optimizers_gan_loop():
    G, D = _gan()
    with ndbg.watch({"G": G, "D": D}, report=False) as run:
        _gan_loop(G, D, 60)
    _assert_unhooked(G)
    _assert_unhooked(D)
    assert run.trace.n_steps == 60  # one step per iteration, not one per optimizer.step()
    names = run.trace.layer_names
    for name in ("G.0", "G.2", "D.0", "D.2"):
        assert name in names, names
    g = run.trace.col("grad_norm")
    for name in ("G.0", "D.0"):
        col = g[1:, names.index(name)]
        assert np.isfinite(col).all() and (col > 0).all(), name
    a = measured(run)
    assert np.isfinite(a[:, names.index("G.2")]).all()
    assert not [str(e) for e in run.events if e.severity == "error"]


@pytest.mark.parametrize("step", [30, 33])  # a sampled step, and one between samples
def test_a_generators_bad_learning_rate_is_found_in_the_generator(step, tmp_path):
    """The discriminator's optimizer steps first and marks the steps; the generator's
    steps after it, and its update is measured and its weights read after it too, so its
    blow-up is found at its step in the generator, not a step late in the
    discriminator's input batch (blamed on the data). The step's learning rate is the
    discriminator's, so the sentence does not quote it for the generator's layers."""
    G, D = _gan()
    with ndbg.watch({"G": G, "D": D}, report=False) as run:
        _gan_loop(G, D, 45, bad_lr=("G", step))
    first = run.first_failure
    assert (first.step, first.kind) == (step, "exploding_update"), first
    assert first.layer.startswith("G."), first
    assert "learning rate" not in first.message, first.message
    primary_lr = {i.name: i.primary_lr for i in run.trace.layers}
    assert not primary_lr["G.0"] and primary_lr["D.0"]
    loaded = ndbg.load(run.save(tmp_path / "gan.npz"))
    assert loaded.trace.layers == run.trace.layers
    assert loaded.reclassify().first_failure.message == first.message


def test_the_generators_output_is_not_the_data():
    """The discriminator's input is the generator's output (detached or not): the
    generator's blow-up is the generator's, not a data anomaly (the data comes first in
    the blame, so an input taken for data would take it)."""
    G, D = _gan()
    with ndbg.watch({"G": G, "D": D}, report=False) as run:
        _gan_loop(G, D, 45, bad_weight=33)
    first = run.first_failure
    assert (first.step, first.layer) == (33, "G.2"), first
    assert not any(e.kind == "data_anomaly" for e in run.events)

    G, D = _gan()  # the real batch still is the data
    with ndbg.watch({"G": G, "D": D}, report=False) as run:
        _gan_loop(G, D, 45, bad_real=33)
    first = run.first_failure
    assert (first.step, first.kind) == (33, "data_anomaly"), first


@pytest.mark.parametrize("fault", ["generator", "real batch"])
def test_a_gradient_penalty_gan_blames_the_generator_or_the_data(fault):
    """WGAN-GP: the critic also reads interpolates of real and generated samples, made to
    take gradients (`requires_grad_`). With several models, such an input is not the
    data (a generator blow-up would be blamed on the input batch through them)."""
    G, D = _gan()
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-4, betas=(0.5, 0.9))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-4, betas=(0.5, 0.9))
    gen = torch.Generator().manual_seed(7)
    with ndbg.watch({"G": G, "D": D}, report=False) as run:
        for step in range(45):
            if step == 33 and fault == "generator":
                with torch.no_grad():
                    G[2].weight.mul_(1e4)
            real = torch.randn(32, 2, generator=gen) * 0.5 + torch.tensor([2.0, -1.0])
            if step == 33 and fault == "real batch":
                real = real * 1000
            z = torch.randn(32, 4, generator=gen)
            fake = G(z).detach()
            eps = torch.rand(32, 1, generator=gen)
            mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
            (grad,) = torch.autograd.grad(D(mix).sum(), mix, create_graph=True)
            penalty = ((grad.norm(dim=1) - 1) ** 2).mean()
            opt_d.zero_grad()
            (D(fake).mean() - D(real).mean() + 10 * penalty).backward()
            opt_d.step()
            opt_g.zero_grad()
            (-D(G(z)).mean()).backward()
            opt_g.step()
    first = run.first_failure
    if fault == "generator":
        assert (first.step, first.layer) == (33, "G.2"), first
    else:
        assert (first.step, first.kind) == (33, "data_anomaly"), first


def test_a_discriminators_bad_learning_rate_names_the_learning_rate():
    G, D = _gan()
    with ndbg.watch({"G": G, "D": D}, report=False) as run:
        _gan_loop(G, D, 45, bad_lr=("D", 33))
    first = run.first_failure
    assert (first.step, first.kind) == (33, "exploding_update"), first
    assert first.layer.startswith("D."), first
    assert "the learning rate went 0.001 -> 100" in first.message, first.message


@pytest.mark.parametrize("given", [False, True])
def test_a_second_model_trained_after_the_first_is_recorded(given):
    """Two models trained one after the other in one block, each with its optimizer (the
    first one's still exists): the second's optimizer takes over the steps at its second
    step, so its steps are closed and its fault is found."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(64, 10, generator=gen), torch.randint(0, 4, (64,), generator=gen)
    first = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
    second = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))
    opt_first = torch.optim.SGD(first.parameters(), lr=0.05)
    opt_second = torch.optim.SGD(second.parameters(), lr=0.05)
    w = ndbg.watch({"a": first, "b": second}, report=False) if given else \
        ndbg.watch(report=False)
    with w as run:
        for _ in range(40):
            opt_first.zero_grad()
            F.cross_entropy(first(x), y).backward()
            opt_first.step()
        for step in range(40):
            if step == 25:
                with torch.no_grad():
                    second[2].weight.mul_(1000)
            opt_second.zero_grad()
            F.cross_entropy(second(x), y).backward()
            opt_second.step()
    # the second model's first step is recorded with its second: 40 + 39 steps. Found
    # as it runs, it is found at the forward after its optimizer's first step (no global
    # module hook once the first model is known): 40 + 38, the fault one step earlier
    assert run.trace.n_steps == (79 if given else 78), run.trace.n_steps
    failure = run.first_failure
    assert failure.step == 40 + (24 if given else 23), failure
    assert failure.layer == ("b.2" if given else "Sequential1.2"), failure
    assert all(i.primary_lr for i in run.trace.layers)
    # the first model, done training, keeps its last gradients (no zero_grad after): it
    # is not a model left out of its optimizer
    assert not [e for e in run.events if e.kind == "weights_not_updated"]


def test_two_optimizers_gan_loop_without_a_model_argument():
    G, D = _gan()
    with ndbg.watch(report=False) as run:
        _gan_loop(G, D, 40)
    _assert_unhooked(G)
    _assert_unhooked(D)
    assert run.trace.n_steps == 40
    assert run.trace.n_layers >= 4
    assert not [str(e) for e in run.events if e.severity == "error"]
