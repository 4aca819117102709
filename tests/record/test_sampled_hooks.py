"""Layer hooks on some steps only (`layer_hooks="sampled"`, the default): on for the forwards of the
steps that read them, off on the others; a step that went wrong is replayed, so a
non-finite value is found at its own step and layer; the training is unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

import neuraldbg_nb as nd
from neuraldbg_nb.detect.wake import wake


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2),
                         nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _batches(n: int):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(32, 10, generator=g), torch.randint(0, 4, (32,), generator=g))
            for _ in range(n)]


def _train(model, batches, *, edit=None, watch=None, seen=None, forward=None):
    """`forward(model, x)`: how the loop calls the model (`model(x)` where None)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for step, (x, y) in enumerate(batches):
        if edit is not None:
            edit(step, model)
        if seen is not None:
            seen.append(sum(len(m._forward_hooks) for m in model))
        loss = nn.functional.cross_entropy(model(x) if forward is None else forward(model, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_layer_hooks_are_on_only_for_the_steps_that_read_them():
    model = _model()
    seen: list[int] = []
    with nd.watch(model, report=False) as run:
        _train(model, _batches(30), seen=seen)
    hooked = [s for s, n in enumerate(seen) if n > 0]
    measured = np.flatnonzero(~np.isnan(run.trace.col("act_absmax")).all(1)).tolist()
    assert hooked == measured  # a healthy run replays nothing
    assert 0 < len(hooked) < 30 / 2
    assert all(s % 4 == 0 or s % 10 == 0 or (s & (s - 1)) == 0 for s in hooked)
    assert sum(len(m._forward_hooks) for m in model) == 0  # none left after the block
    assert run.first_failure is None


@pytest.mark.parametrize("at", [13, 21, 27])
def test_a_nan_at_an_unhooked_step_is_found_at_its_step_and_layer(at):
    def edit(step, model):
        if step == at:
            with torch.no_grad():
                model[4].weight[3, 5] = math.nan

    model = _model()
    seen: list[int] = []
    with nd.watch(model, report=False) as run:
        _train(model, _batches(35), edit=edit, seen=seen)
    assert seen[at] == 0  # the step's forward ran without layer hooks
    ff = run.first_failure
    assert (ff.step, ff.layer, ff.kind) == (at, "4", "nonfinite_activation"), ff
    cap = run.inspect(ff)
    assert cap.step == at and not torch.isfinite(cap["output"]).all()


def test_a_run_that_stays_non_finite_is_replayed_at_its_first_such_step_only():
    """A NaN put into a weight at step 13 spreads to every weight with the update and
    stays: the step it began is replayed (its first failure found there, at its layer),
    the unhooked steps after it, all non-finite as well, are not: each would cost a
    forward and find nothing new. Nor do the weights, non-finite as each update leaves
    them, read as edited outside the optimizer (`w_edited`), which would wake a scan at
    every step."""
    at = 13

    def edit(step, model):
        if step == at:
            with torch.no_grad():
                model[4].weight[3, 5] = math.nan

    model = _model()
    with nd.watch(model, report=False) as run:
        _train(model, _batches(40), edit=edit)
    ff = run.first_failure
    assert (ff.step, ff.layer, ff.kind) == (at, "4", "nonfinite_activation"), ff
    assert not np.isfinite(run.trace.scalar("loss")[at:]).any()  # it stayed
    assert run.recorder.replays == 1
    assert not np.isinf(run.trace.col("w_edited")[at + 2:]).any()
    assert not wake(run.trace, run.thresholds), "the newest step is nothing new"


def test_training_is_bit_identical_with_replays():
    def edit(step, model):  # the loss and gradients jump at unhooked steps: replays
        if step in (13, 22):
            with torch.no_grad():
                model[6].weight.mul_(30.0)

    plain = _model()
    losses = _train(plain, _batches(30), edit=edit)
    rng = torch.get_rng_state()
    watched = _model()
    with nd.watch(watched, report=False) as run:
        losses_w = _train(watched, _batches(30), edit=edit)
    assert run.recorder.replays >= 2
    assert losses == losses_w
    assert torch.equal(rng, torch.get_rng_state())
    for a, b in zip(plain.state_dict().values(), watched.state_dict().values()):
        assert torch.equal(a, b)  # weights and BatchNorm's running statistics


def test_the_global_module_hook_is_gone_once_the_models_are_known():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    later = nn.Sequential(nn.Linear(10, 8), nn.Tanh(), nn.Linear(8, 4))
    opt_later = torch.optim.SGD(later.parameters(), lr=0.01)
    before = len(nn_module._global_forward_pre_hooks)
    hooks: list[int] = []
    with nd.watch(report=False) as run:
        for step, (x, y) in enumerate(_batches(12)):
            net, o = (model, opt) if step < 6 else (later, opt_later)
            loss = nn.functional.cross_entropy(net(x), y)
            o.zero_grad()
            loss.backward()
            o.step()
            hooks.append(len(nn_module._global_forward_pre_hooks) - before)
    assert hooks[:6] == [0] * 6  # off from the first step boundary on
    assert hooks[6] == 1  # an optimizer of weights of no model found: back for one forward
    assert hooks[7:] == [0] * 5  # the later model found, off again
    assert any(n.startswith("Sequential1") for n in run.trace.layer_names)
    assert len(nn_module._global_forward_pre_hooks) == before


def test_inputs_changed_in_place_after_the_forward_refuse_the_replay_with_a_note():
    """A loop that reuses its input buffer in place after the forward: the step's
    forward cannot be run again as it ran, so it is not replayed; the run says so once,
    and the NaN is still found (from the next measured step on)."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with nd.watch(model, report=False) as run:
        for step, (x, y) in enumerate(_batches(35)):
            if step == 21:
                with torch.no_grad():
                    model[4].weight[3, 5] = math.nan
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            x.zero_()  # the buffer reused in place before the optimizer's step
            opt.step()
    assert run.recorder.replays == 0
    said = [n for n in run.notes if "could not be replayed" in n]
    assert len(said) == 1 and "in place" in said[0]
    ff = run.first_failure
    assert ff is not None and ff.step >= 21


def test_a_weight_changed_outside_the_optimizer_is_replayed_at_its_step():
    """A moderate edit (x1.5) at an unhooked step moves neither the loss nor a gradient
    by the wake factor; the weight slice read before the update says it changed, and the
    step's forward is replayed there. A healthy step is not."""
    at = 13

    def edit(step, model):
        if step == at:
            with torch.no_grad():
                model[4].weight.mul_(1.5)

    model = _model()
    seen: list[int] = []
    with nd.watch(model, report=False) as run:
        _train(model, _batches(20), edit=edit, seen=seen)
    act = run.trace.col("act_absmax")
    assert seen[at] == 0 and seen[at - 2] == 0
    assert not np.isnan(act[at]).all()  # replayed
    assert np.isnan(act[at - 2]).all()  # a healthy unhooked step: not replayed
    assert run.recorder.replays >= 1


def test_edited_reads_moves_as_factors_of_the_weights_norm():
    from neuraldbg_nb.record.replay import edited

    assert not edited([0.0, 0.0, math.nan])
    assert not edited([0.005, 0.0, math.nan])  # a small move: a clamp, a decay
    assert edited([0.25, 0.0, math.nan])
    assert edited([math.inf, 0.0, math.nan])  # weights that became non-finite


def test_weights_edited_before_the_forward_are_a_row_of_w_edited():
    """`w_edited` reads, as the step's update begins, how far each layer's weights moved
    since the last update, over their norm: 0 at every step but the one whose weights
    were multiplied by 5 in place before its forward (a move of 4x their size)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 10, generator=torch.Generator().manual_seed(0))
    with nd.watch(model, report=False) as run:
        for step in range(12):
            if step == 7:
                with torch.no_grad():
                    model[4].weight.mul_(5)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    moved = run.trace.col("w_edited")
    j = run.trace.layer_index("4")
    assert np.isnan(moved[0]).all()  # no update before the first step
    assert moved[7, j] == pytest.approx(4.0, rel=0.05)
    others = np.delete(moved[1:], 6, axis=0)
    assert np.nanmax(others) < 1e-6 and np.nanmax(np.delete(moved[7], j)) < 1e-6


def test_a_loop_that_updates_its_weights_itself_has_no_edits_read():
    """A step ended by hand (`run.step()`) follows the loop's own update, and a step given
    a closure closes after its update: neither is read as weights changed outside the
    optimizer, however far the update moved them."""
    model = _model()
    x = torch.randn(16, 10, generator=torch.Generator().manual_seed(0))
    with nd.watch(model, report=False) as run:
        for _ in range(6):
            model.zero_grad()
            model(x).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 5.0 * p.grad  # an update of about the weights' size, by hand
            run.step()
    assert np.isnan(run.trace.col("w_edited")).all()
    assert not [e for e in run.events if e.signal == "edited"]

    model = _model()
    lbfgs = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=5)

    def closure() -> torch.Tensor:
        lbfgs.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    with nd.watch(model, report=False) as run:
        for _ in range(4):
            lbfgs.step(closure)
    assert np.isnan(run.trace.col("w_edited")).all()


def test_the_step_after_a_learning_rate_move_is_hooked():
    """The learning rate raised 30x at step 13's update: the forward after it is hooked
    (the weights it runs on moved unlike before), a step that would not be otherwise."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[int] = []
    with nd.watch(model, report=False):
        for step, (x, y) in enumerate(_batches(20)):
            if step == 13:
                for g in opt.param_groups:
                    g["lr"] *= 30
            seen.append(sum(len(m._forward_hooks) for m in model))
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert seen[13] == 0 and seen[14] > 0 and seen[15] == 0


def test_a_gan_step_replays_only_the_calls_after_the_other_optimizers_update():
    """The discriminator's optimizer closes the step; the generator's update comes before
    the next forward. A step replayed at the discriminator's step reads, bit for bit,
    what every-step hooks read there: the generator's call made before its own update is
    not run again on the updated weights."""
    from models import gan

    fakes: list[float] = []

    def run(mode: str):
        g = gan()
        at = 13  # not hooked: not sampled, not a power of 2 nor a multiple of 4
        bce = nn.functional.binary_cross_entropy_with_logits
        with nd.watch({"G": g.G, "D": g.D}, report=False, layer_hooks=mode) as r:
            for step in range(20):
                if step == at:
                    with torch.no_grad():
                        g.D[0].weight.mul_(40.0)
                real = torch.randn(32, 2, generator=g.gen) + 2.0
                z = torch.randn(32, 4, generator=g.gen)
                g.opt_d.zero_grad()
                fake = g.G(z).detach()
                if step == at:
                    fakes.append(fake.abs().max().item())
                (bce(g.D(real), torch.ones(32, 1))
                 + bce(g.D(fake), torch.zeros(32, 1))).backward()
                g.opt_d.step()
                g.opt_g.zero_grad()
                bce(g.D(g.G(z)), torch.ones(32, 1)).backward()
                g.opt_g.step()
        return r, at

    every, at = run("every")
    sampled, _ = run("sampled")
    assert sampled.trace.scalar("hooked")[at - 2] == 0 and sampled.recorder.replays >= 1
    assert sampled.trace.scalar("hooked")[at] == 1  # replayed
    names = sampled.trace.layer_names
    got = sampled.trace.col("act_absmax", at, at + 1)[0]
    d = [i for i, n in enumerate(names) if n.startswith("D")]
    np.testing.assert_array_equal(got[d], every.trace.col("act_absmax", at, at + 1)[0][d])
    # the generator's: its call of the step itself (every-step hooks also count its call
    # for the generator's own update of the step before, which ran on other weights)
    assert got[names.index("G.2")] == pytest.approx(fakes[1], rel=1e-6)
    np.testing.assert_array_equal(sampled.trace.scalar("loss"), every.trace.scalar("loss"))


def test_layer_hooks_takes_sampled_or_every():
    with pytest.raises(ValueError, match="layer_hooks must be 'sampled' or 'every'"):
        nd.watch(nn.Linear(2, 2), layer_hooks="some")


def _parts() -> nn.ModuleDict:
    torch.manual_seed(0)
    return nn.ModuleDict({"enc": nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.2),
                                               nn.Linear(32, 16)),
                          "dec": nn.Sequential(nn.ReLU(), nn.Linear(16, 4))})


def _through_parts(model: nn.ModuleDict, x: torch.Tensor) -> torch.Tensor:
    """The loop calls the model's parts, never the model (an encoder-decoder kept in one
    ModuleDict; a Lightning `training_step` calling `self.net(x)`)."""
    return model["dec"](model["enc"](x))


def test_a_loop_that_calls_the_models_parts_is_replayed_through_them():
    """The parts the loop calls are heard from the step after the first: a NaN weight at
    a step between the sampled ones is replayed through the two parts' calls and found at
    its own step and layer; the training is bit-identical; the parts' inputs are not taken
    for the data (the encoder's output is not an input batch)."""
    at = 13

    def edit(step, model):
        if step == at:
            with torch.no_grad():
                model["dec"][1].weight[2, 3] = math.nan

    plain = _parts()
    losses = _train(plain, _batches(30), edit=edit, forward=_through_parts)
    model = _parts()
    with nd.watch(model, report=False) as run:
        losses_w = _train(model, _batches(30), edit=edit, forward=_through_parts)
    assert losses[:at] == losses_w[:at] and all(map(math.isnan, losses[at:] + losses_w[at:]))
    ff = run.first_failure
    assert (ff.step, ff.layer, ff.kind) == (at, "dec.1", "nonfinite_activation"), ff
    assert run.recorder.replays == 1 and run.trace.scalar("hooked")[at - 1] == 0
    assert np.isnan(run.trace.scalar("in_absmax")).all()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


class _Flagged(nn.Module):
    """`_model()`'s layers, called in turn; while `blow` is set, layer 4's output is
    multiplied by infinity (`noise`: numpy's normal draws, scaled, added to it at every
    call)."""

    def __init__(self, noise: float = 0.0) -> None:
        super().__init__()
        self.net = _model()
        self.blow = False
        self.noise = noise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.net):
            x = layer(x)
            if i == 4:
                if self.blow:
                    x = x * math.inf
                if self.noise:
                    x = x + self.noise * float(np.random.randn())
        return x


class _WithLoss(nn.Module):
    """A model that computes its loss and returns it first, its logits after (as a
    transformers model given labels does)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _Flagged()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.inner(x)
        return nn.functional.cross_entropy(logits, y), logits


@pytest.mark.parametrize("returns", ["logits", "loss, scaled in place after"])
def test_a_forward_that_reads_state_changed_after_it_is_not_replayed_as_the_steps(returns):
    """The loop sets a flag for one step's forward and clears it after `backward()`: the
    replay, run before the update, computes a finite output where the training's was not;
    its numbers are not the step's. The run says why, and names the step from its
    every-step numbers. Also where the model returns its loss first and the loop scales
    it in place (the transformers Trainer does): the logits beside it are compared."""
    at = 13
    model = _Flagged() if returns == "logits" else _WithLoss()
    flagged = model if returns == "logits" else model.inner
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with nd.watch(model, report=False) as run:
        for step, (x, y) in enumerate(_batches(30)):
            flagged.blow = step == at
            if returns == "logits":
                loss = nn.functional.cross_entropy(model(x), y)
            else:
                loss = model(x, y)[0]
                loss *= 1.0
            opt.zero_grad()
            loss.backward()
            flagged.blow = False
            opt.step()
    assert run.recorder.replays == 0
    assert np.isnan(run.trace.col("act_absmax")[at]).all()  # no replayed numbers kept
    said = [n for n in run.notes if "could not be replayed" in n]
    assert len(said) == 1 and "gave another output" in said[0], run.notes
    ff = run.first_failure
    assert ff is not None and ff.step == at, ff


def test_a_forward_that_draws_outside_torchs_generators_is_not_replayed_as_the_steps():
    """Noise from numpy's generator in the forward: a replay draws other numbers, so it
    does not compute the step's output, and is not used (a weight edited at an unhooked
    step asks for one: `test_a_weight_changed_outside_the_optimizer_is_replayed_at_its_step`).
    The same loop without the noise is replayed there."""
    at = 13

    def edit(step, model):
        if step == at:
            with torch.no_grad():
                model.net[4].weight.mul_(1.5)

    replays = []
    for noise in (0.0, 0.05):
        np.random.seed(0)
        model = _Flagged(noise)
        with nd.watch(model, report=False) as run:
            _train(model, _batches(20), edit=edit)
        replays.append(run.recorder.replays)
        said = [n for n in run.notes if "gave another output" in n]
        assert bool(said) == (noise > 0), run.notes
    assert replays[0] >= 1 and replays[1] == 0


def test_a_refused_replay_names_the_hooked_layer_as_the_watch_names_it():
    """The loop calls a part of the watched model (a LightningModule's `self.net`), one of
    whose layers has a hook of the user's own that changes its output: the replay of a
    step that went wrong runs without it, gives another output, and is refused; the note
    names that layer as the run does ("net.4", not "4")."""
    at = 13

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

    def edit(step, model):
        if step == at:
            with torch.no_grad():
                model.net[4].weight.mul_(1.5)

    model = Wrapper()
    model.net[4].register_forward_hook(lambda m, a, y: y * 0.5)
    with nd.watch(model, report=False) as run:
        _train(model, _batches(20), edit=edit, forward=lambda m, x: m.net(x))
    said = [n for n in run.notes if "could not be replayed" in n]
    assert said and "forward hooks of its own (net.4's" in said[0], run.notes


class _Gained(nn.Module):
    """A layer whose output is scaled by an attribute the test sets: a fault only its
    activations show (no weight, no gradient of its own moves first)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)
        self.gain = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.gain


def _gained_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), _Gained(), nn.ReLU(), nn.Linear(32, 32),
                         nn.ReLU(), nn.Linear(32, 4))


def test_a_users_logging_hook_hears_each_call_once_and_the_step_is_still_replayed():
    """A user's feature logger on a later layer: a fault at a step whose layers were not
    hooked is still found at its own layer and step by the replay, which runs without the
    user's hook (it hears each of the training's calls once, and stays on the model)."""
    at = 13

    def edit(step, model):
        if step == at:
            model[2].gain = 1e4

    model = _gained_model()
    heard: list[float] = []
    model[5].register_forward_hook(lambda m, a, y: heard.append(float(y.detach().mean())))
    with nd.watch(model, report=False) as run:
        _train(model, _batches(20), edit=edit)
    assert len(heard) == 20 and len(model[5]._forward_hooks) == 1
    assert run.recorder.replays >= 1
    first = run.first_failure
    assert first is not None and (first.layer, first.step) == ("2", at), run.events[:3]


def test_a_generator_given_to_the_forward_draws_the_same_numbers_when_replayed():
    """A forward that draws noise from a generator the loop passes in: a replay of a step
    that went wrong draws from where the generator stood at the call and leaves it where
    the training left it, so the losses are bit-identical to the unwatched training's."""
    at = 13

    class Noisy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _gained_model()

        def forward(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
            return self.net(x + 0.1 * torch.randn(x.shape, generator=gen))

    def train(watch: bool) -> tuple[list[float], int]:
        model = Noisy()
        gen = torch.Generator().manual_seed(1)

        def edit(step, m):
            if step == at:
                m.net[2].gain = 1e4

        def forward(m, x):
            return m(x, gen)

        if not watch:
            return _train(model, _batches(20), edit=edit, forward=forward), 0
        with nd.watch(model, report=False) as run:
            losses = _train(model, _batches(20), edit=edit, forward=forward)
        assert not any("could not be replayed" in n for n in run.notes), run.notes
        return losses, run.recorder.replays

    plain, _ = train(False)
    watched, replays = train(True)
    assert replays >= 1
    assert np.array_equal(plain, watched, equal_nan=True)
