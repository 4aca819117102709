"""Failures with no NaN and no explosion, in real short trainings: the run trains, the loss
moves, and part of the model learns nothing. Each is named at the step it begins, with the
layer; the healthy twin of each stays quiet.

- Optimizer membership (`not_in_optimizer`): a head replaced after the optimizer was built,
  a layer unfrozen without adding it to the optimizer; not a layer unfrozen and added, a
  GAN whose generator gets gradients from the discriminator's loss before its own optimizer
  first steps, nor (beyond a warning) a loss network left trainable.
- Layers cut off from the loss (`cut_off`): an autoencoder whose latent is detached, a
  generator trained on `fake.detach()`, a residual branch added detached; not frozen
  layers, a pooler whose output the loss does not use (info), heads trained in turn.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loops import assert_no_errors, task_batches
from models import gan
from torch import nn

import neuraldbg_nb as ndbg


def _backbone_and_head(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 5))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int,
           on_step_start=None) -> list[float]:
    x, y = task_batches()
    losses = []
    for step in range(steps):
        if on_step_start is not None:
            on_step_start(step, model, opt)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[step]), y[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _errors(run) -> list[str]:
    return [str(e) for e in run.events if e.severity == "error"]


def test_a_head_replaced_after_the_optimizer_was_built_is_the_first_failure_at_step_0():
    """Fine-tuning: the optimizer is built, then the 5-class head is swapped for a 2-class
    one. The new head's gradients reach no optimizer; the rest trains and the loss falls a
    little. An error at step 0 naming the head and saying it was replaced; the training is
    the same bit for bit with and without the watch."""
    def replaced() -> tuple[nn.Module, torch.optim.Optimizer]:
        model = _backbone_and_head()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        torch.manual_seed(1)
        model[4] = nn.Linear(32, 2)
        return model, opt

    model, opt = replaced()
    with ndbg.watch(model, report=False) as run:
        losses = _train(model, opt, 30)
    assert losses == _train(*replaced(), 30)
    first = run.first_failure
    assert (first.kind, first.layer, first.step, first.severity) == (
        "not_in_optimizer", "4", 0, "error"), first
    assert "replaced after the optimizer was built" in first.message, first.message
    assert "add_param_group" in first.message
    assert [e.layer for e in run.events if e.kind == "not_in_optimizer"] == ["4"]


def _unfreeze_at(step: int, add: bool):
    def hook(s, model, opt):
        if s == step:
            model[2].requires_grad_(True)
            if add:
                opt.add_param_group({"params": model[2].parameters(), "lr": 0.01})
    return hook


def test_a_layer_unfrozen_without_adding_it_to_the_optimizer_is_an_error_at_that_step():
    """Gradual unfreezing: the middle layer starts frozen and the optimizer is built from
    the trainable weights; at step 12 it is unfrozen, but never added. From step 12 it
    gets gradients no optimizer applies: an error there, naming it."""
    model = _backbone_and_head()
    model[2].requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with ndbg.watch(model, report=False) as run:
        _train(model, opt, 30, on_step_start=_unfreeze_at(12, add=False))
    first = run.first_failure
    assert (first.kind, first.layer, first.step) == ("not_in_optimizer", "2", 12), first
    assert "no optimizer holds" in first.message and "from step 12" in first.message


@pytest.mark.parametrize("held", [True, False])
def test_a_layer_frozen_while_its_optimizer_holds_it_is_said_as_an_info(held):
    """`requires_grad_(False)` on the middle layer after the optimizer was built from
    every weight (a freeze on the wrong layer, or on purpose): it runs and never trains,
    which nothing else would say; an info from step 0 naming it, no error. Left out of
    the optimizer (`held` False: a backbone frozen on purpose), nothing is said."""
    model = _backbone_and_head()
    if held:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        model[2].requires_grad_(False)
    else:
        model[2].requires_grad_(False)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with ndbg.watch(model, report=False) as run:
        _train(model, opt, 40)
    assert run.first_failure is None and not _errors(run)
    frozen = [(e.layer, e.step, e.severity) for e in run.events if e.signal == "frozen"]
    assert frozen == ([("2", 0, "info")] if held else []), run.events
    assert not [e for e in run.events if e.kind == "cut_off"]


def test_stop_on_error_stops_a_layer_unfrozen_without_its_optimizer_at_that_step():
    """Read from the optimizers at every step, not sampled: a live run with
    `stop_on="error"` stops at the step the layer was unfrozen."""
    model = _backbone_and_head()
    model[2].requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with pytest.raises(ndbg.TrainingFailure) as info, \
            ndbg.watch(model, stop_on="error", report=False):
        _train(model, opt, 30, on_step_start=_unfreeze_at(12, add=False))
    run = info.value.run
    assert run.trace.n_steps == 13
    assert (run.first_failure.kind, run.first_failure.step) == ("not_in_optimizer", 12)


def test_a_layer_unfrozen_and_added_to_the_optimizer_is_quiet():
    model = _backbone_and_head()
    model[2].requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with ndbg.watch(model, report=False) as run:
        _train(model, opt, 30, on_step_start=_unfreeze_at(12, add=True))
    assert not [e for e in run.events if e.kind == "not_in_optimizer"]
    assert_no_errors(run)
    assert (run.trace.col("grad_unheld")[:, [0, 2, 4]] == 0).all()


def test_a_gan_whose_generator_gets_the_discriminators_gradients_is_not_out_of_its_optimizer():
    """The discriminator's loss is taken on `G(z)` without `.detach()`: at the step's close
    (the discriminator's step, the first one) the generator holds gradients, and its own
    optimizer has not stepped yet. It is found holding them: no event."""
    g = gan()
    G, D, opt_g, opt_d, gen = g.G, g.D, g.opt_g, g.opt_d, g.gen
    bce = F.binary_cross_entropy_with_logits
    with ndbg.watch({"G": G, "D": D}, report=False) as run:
        for _ in range(30):
            real = torch.randn(32, 2, generator=gen) * 0.5 + 1.0
            z = torch.randn(32, 4, generator=gen)
            opt_d.zero_grad()
            fake = G(z)
            (bce(D(real), torch.ones(32, 1)) + bce(D(fake), torch.zeros(32, 1))).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(D(G(z)), torch.ones(32, 1)).backward()
            opt_g.step()
    assert not [e for e in run.events if e.kind == "not_in_optimizer"], run.events
    assert_no_errors(run)


def test_a_loss_network_left_trainable_is_a_warning_not_an_error():
    """A perceptual-loss network whose weights still require gradients: the student's loss
    backpropagates through it, and no optimizer holds any of its weights. Its gradients
    are computed for nothing, which breaks no training: a warning, no error."""
    torch.manual_seed(1)
    critic = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 1))
    student = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(student.parameters(), lr=0.05)
    x, y = task_batches()
    with ndbg.watch({"student": student, "critic": critic}, report=False) as run:
        for step in range(20):
            opt.zero_grad()
            logits = student(x[step])
            (F.cross_entropy(logits, y[step]) + critic(logits).square().mean()).backward()
            opt.step()
    warned = [e for e in run.events if e.kind == "not_in_optimizer"]
    assert {(e.layer, e.severity, e.step) for e in warned} == {
        ("critic.0", "warning", 0), ("critic.2", "warning", 0)}, warned
    assert "requires_grad_(False)" in warned[0].message
    assert not _errors(run)


class _AutoEncoder(nn.Module):
    def __init__(self, detach: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.detach = detach
        self.encoder = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 4))
        self.decoder = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.encoder(x)
        return self.decoder(z.detach() if self.detach else z)


def _train_autoencoder(model: nn.Module, steps: int) -> list[float]:
    gen = torch.Generator().manual_seed(2)
    basis = torch.randn(4, 12, generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 4, generator=gen) @ basis
        opt.zero_grad()
        loss = F.mse_loss(model(x), x)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_an_autoencoder_whose_latent_is_detached_is_cut_off_from_step_0():
    """`decoder(z.detach())`: the encoder runs every step and Adam holds it, but no
    gradient reaches it; the decoder trains and the loss falls. An error dated from step
    0 naming the encoder's first layer as the first failure, and each of its layers."""
    model = _AutoEncoder(detach=True)
    with ndbg.watch(model, report=False) as run:
        losses = _train_autoencoder(model, 30)
    assert losses == _train_autoencoder(_AutoEncoder(detach=True), 30)
    first = run.first_failure
    assert (first.kind, first.layer, first.step, first.severity) == (
        "cut_off", "encoder.0", 0, "error"), first
    assert "layers after it get one" in first.message and ".detach()" in first.message
    assert {e.layer for e in run.events if e.kind == "cut_off"} == {"encoder.0", "encoder.2"}
    model = _AutoEncoder(detach=False)
    with ndbg.watch(model, report=False) as healthy:
        _train_autoencoder(model, 30)
    assert not [e for e in healthy.events if e.kind == "cut_off"]
    assert_no_errors(healthy)


def _gan(detach_for_g: bool, steps: int = 30):
    g = gan()
    G, D, opt_g, opt_d, gen = g.G, g.D, g.opt_g, g.opt_d, g.gen
    bce = F.binary_cross_entropy_with_logits
    with ndbg.watch({"G": G, "D": D}, report=False) as run:
        for _ in range(steps):
            real = torch.randn(32, 2, generator=gen) * 0.5 + 1.0
            z = torch.randn(32, 4, generator=gen)
            opt_d.zero_grad()
            opt_g.zero_grad()
            fake = G(z)
            (bce(D(real), torch.ones(32, 1)) + bce(D(fake.detach()), torch.zeros(32, 1))
             ).backward()
            opt_d.step()
            opt_g.zero_grad()
            bce(D(fake.detach() if detach_for_g else fake), torch.ones(32, 1)).backward()
            opt_g.step()
    return run


def test_a_generator_trained_on_fake_detach_is_cut_off_and_its_healthy_twin_is_quiet():
    """The generator's loss is taken on `fake.detach()`: its optimizer steps every
    iteration, on no gradient. Both zero_grad calls come first, so at the step's close
    (the discriminator's step) the generator never holds a gradient, healthy or not: what
    its own optimizer finds at its step decides."""
    run = _gan(detach_for_g=True)
    first = run.first_failure
    assert (first.kind, first.layer, first.step) == ("cut_off", "G.0", 0), first
    assert "no layer of its model gets a gradient" in first.message
    assert {e.layer for e in run.events if e.kind == "cut_off"} == {"G.0", "G.2"}
    healthy = _gan(detach_for_g=False)
    assert not [e for e in healthy.events if e.kind == "cut_off"], healthy.events
    assert_no_errors(healthy)


class _WithPooler(nn.Module):
    """A token model with a pooler whose output the token loss does not use."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.tokens = nn.Linear(16, 2)
        self.pooler = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.tokens(h), torch.tanh(self.pooler(h.mean(0)))


def test_an_unused_pooler_and_frozen_layers_are_not_cut_off():
    """A pooler computed every step whose output the loss leaves unused is said (info),
    not an error; a layer frozen with requires_grad_(False) and left in the optimizer is
    not judged."""
    model = _WithPooler()
    model.body[0].requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = task_batches()
    with ndbg.watch(model, report=False) as run:
        for step in range(30):
            opt.zero_grad()
            F.cross_entropy(model(x[step])[0], y[step]).backward()
            opt.step()
    cut = [e for e in run.events if e.kind == "cut_off"]
    assert [(e.layer, e.severity, e.step) for e in cut] == [("pooler", "info", 0)], cut
    assert "output does not reach the loss" in cut[0].message
    assert_no_errors(run)


class _Residual(nn.Module):
    """Residual blocks `h + block(h)` and a recurrent branch `h + gru(h)`; the branch named
    in `detached` is added as `h + branch(h).detach()` from step `since` on (the loop sets
    `step`), so its weights get no gradient while its output still changes the model's."""

    def __init__(self, detached: str | None = None, since: int = 0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(6, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(0.1))
                                    for _ in range(3))
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.out = nn.Linear(16, 2)
        self.detached, self.since, self.step = detached, since, 0

    def _add(self, name: str, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        cut = name == self.detached and self.step >= self.since
        return h + (y.detach() if cut else y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for k, block in enumerate(self.blocks):
            h = self._add(f"blocks.{k}", h, block(h))
        h = self._add("gru", h, self.gru(h.unsqueeze(1))[0].squeeze(1))
        return self.out(h)


def _train_residual(model: _Residual, steps: int = 30) -> list[float]:
    def tell(step: int, m: nn.Module, opt: torch.optim.Optimizer) -> None:
        model.step = step
    return _train(model, torch.optim.Adam(model.parameters(), lr=1e-3), steps, tell)


@pytest.mark.parametrize(("detached", "since", "layer"), [
    ("blocks.1", 0, "blocks.1.0"), ("blocks.2", 12, "blocks.2.0"), ("gru", 5, "gru")])
def test_a_residual_branch_added_detached_is_cut_off_from_the_step_it_begins(detached, since,
                                                                            layer):
    """`h + block(h).detach()`: the block runs, Adam holds it, the layers after it get
    gradients and so do those before it (through the skip), but it gets none. Unlike a
    pooler it is used: the step replayed with its output changed gives another model
    output. An error, the first failure, dated from the step the detach begins, naming the
    branch's layer (a Linear in a block, a GRU returning a tuple); the training is the
    same bit for bit, dropout included, and its random state after it too."""
    with ndbg.watch(model := _Residual(detached, since), report=False) as run:
        losses = _train_residual(model)
    after = torch.get_rng_state()
    assert losses == _train_residual(_Residual(detached, since))
    assert torch.equal(after, torch.get_rng_state())
    first = run.first_failure
    assert (first.kind, first.layer, first.step, first.severity) == (
        "cut_off", layer, since, "error"), first
    assert "its output is used" in first.message and "h + block(h).detach()" in first.message
    assert [e.layer for e in run.events if e.kind == "cut_off"] == [layer]


class _Block(nn.Module):
    """A pre-norm transformer block whose attention branch is added detached where
    `detached`; its model holds a parameter its forward never reads."""

    def __init__(self, detached: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(16), nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.detached = detached

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a = self.attn(h, h, h, need_weights=False)[0]
        x = x + (a.detach() if self.detached else a)
        return x + self.mlp(self.ln2(x))


def _train_blocks(detached: bool) -> tuple[object, list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 16), _Block(detached), nn.Linear(16, 20))
    model.register_parameter("unread", nn.Parameter(torch.ones(())))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 20, (30, 8, 7), generator=torch.Generator().manual_seed(1))
    losses = []
    with ndbg.watch(model, report=False) as run:
        for batch in tokens:
            opt.zero_grad()
            loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, 20), batch[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return run, losses


def test_an_attention_branch_added_detached_is_cut_off_and_an_unread_parameter_is_not():
    """The attention (a layer with weights of its own and a child it calls through its
    weights) and the LayerNorm that feeds only it get no gradient while their output
    changes the model's: errors from step 0, the LayerNorm first in forward order. The
    model's own parameter that its forward never reads leaves it without a gradient
    while its layers get theirs: an unused weight (info), healthy or not."""
    run, _ = _train_blocks(detached=True)
    cut = {e.layer: e.severity for e in run.events if e.kind == "cut_off"}
    assert cut == {"1.ln1": "error", "1.attn": "error", "Sequential": "info"}, cut
    first = run.first_failure
    assert (first.kind, first.layer, first.step) == ("cut_off", "1.ln1", 0), first
    healthy, _ = _train_blocks(detached=False)
    assert [e.severity for e in healthy.events if e.kind == "cut_off"] == ["info"]
    assert_no_errors(healthy)


def test_a_detached_branch_is_asked_again_where_its_first_replay_could_not_tell():
    """The loop scales its first batch in place after the backward: that step cannot be
    replayed as it ran, so the branch reads as unused there (info); the next step's
    replay tells it is used, and the error is dated from there."""
    model = _Residual("blocks.1")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = task_batches()
    with ndbg.watch(model, report=False) as run:
        for step in range(20):
            batch = x[step].clone()
            opt.zero_grad()
            F.cross_entropy(model(batch), y[step]).backward()
            if step == 0:
                batch.mul_(1.0)  # (in place: the forward cannot be run again as it ran)
            opt.step()
    errors = [(e.layer, e.step) for e in run.events if e.kind == "cut_off"
              and e.severity == "error"]
    assert errors == [("blocks.1.0", 1)], run.events


class _TwoOutputs(nn.Module):
    """A model returning an embedding before its logits, as a tuple or a dict; the loss
    reads the logits alone. With `detached`, a branch is added to the logits detached."""

    def __init__(self, as_dict: bool, detached: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.embed = nn.Linear(16, 8)
        self.head = nn.Linear(16, 2)
        self.branch = nn.Linear(16, 2)
        self.as_dict, self.detached = as_dict, detached

    def forward(self, x: torch.Tensor) -> object:
        h = self.body(x)
        extra = self.branch(h)
        logits = self.head(h) + (extra.detach() if self.detached else extra)
        emb = self.embed(h)
        return {"embedding": emb, "logits": logits} if self.as_dict else (emb, logits)


@pytest.mark.parametrize("as_dict", [False, True], ids=["tuple", "dict"])
def test_an_output_before_the_one_the_loss_reads_is_unused_and_a_detached_branch_still_named(
        as_dict):
    """The embedding comes first in the model's output and the loss never reads it: its
    layer is unused (info), not cut off, since changing it moves only the output the loss
    leaves alone. A branch added to the logits detached is an error at step 0 all the
    same: the logits, which the loss reads, move with it."""
    def train(detached: bool):
        model = _TwoOutputs(as_dict, detached)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = task_batches()
        with ndbg.watch(model, report=False) as run:
            for step in range(20):
                opt.zero_grad()
                out = model(x[step])
                F.cross_entropy(out["logits"] if as_dict else out[1], y[step]).backward()
                opt.step()
        return run

    healthy = train(detached=False)
    cut = [(e.layer, e.severity, e.step) for e in healthy.events if e.kind == "cut_off"]
    assert cut == [("embed", "info", 0)], healthy.events
    assert_no_errors(healthy)
    broken = train(detached=True)
    cut = {e.layer: (e.severity, e.step) for e in broken.events if e.kind == "cut_off"}
    assert cut == {"embed": ("info", 0), "branch": ("error", 0)}, broken.events
    first = broken.first_failure
    assert (first.kind, first.layer, first.step) == ("cut_off", "branch", 0), first


def test_residual_branches_that_all_train_are_not_cut_off():
    """The healthy twin: every branch added as it is, nothing cut off, no error."""
    with ndbg.watch(model := _Residual(), report=False) as run:
        _train_residual(model)
    assert not [e for e in run.events if e.kind == "cut_off"], run.events
    assert_no_errors(run)


def _scheduled(step_size: int, per_batch: bool, steps: int = 90, zero_lr_layer: bool = False,
               gamma: float = 0.1):
    model = _backbone_and_head()
    groups = [{"params": model[0].parameters(), "lr": 0.0 if zero_lr_layer else 0.05},
              {"params": list(model[2].parameters()) + list(model[4].parameters())}]
    opt = torch.optim.SGD(groups, lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma)
    x, y = task_batches()
    with ndbg.watch(model, report=False) as run:
        for step in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x[step % len(x)]), y[step % len(y)]).backward()
            opt.step()
            if per_batch or step % 30 == 29:
                sched.step()
    return run


def test_a_step_schedule_stepped_per_batch_stops_the_whole_model_an_error_from_when_it_began():
    """StepLR(step_size=5, gamma=0.1) stepped every batch instead of every epoch: the
    learning rate falls 10x every 5 steps, and by about step 45 no float32 weight moves.
    Every layer stalled is the whole model stopped learning: an error and the first
    failure, with the learning rate in the sentence."""
    run = _scheduled(5, per_batch=True)
    first = run.first_failure
    assert (first.kind, first.signal, first.layer) == ("weights_not_updated", "model", None), \
        first
    lr = run.trace.scalar("lr")
    assert first.step == int(np.argmax(lr < 1e-8)), (first.step, lr)
    assert not [e for e in run.events if e.severity == "error" and e.step < first.step]
    assert "whole model stopped learning" in first.message
    assert "learning rate is" in first.message and "per batch" in first.message


def test_halvings_stepped_per_batch_are_named_when_they_add_up_and_beside_the_failure():
    """StepLR(step_size=10, gamma=0.5) stepped every batch: no drop is 10x, four drops
    are 16x by step 40, a warning with the rate's path; the failure the small rate leaves
    later names it as its likely cause. Per epoch (every 30 steps) it is quiet."""
    run = _scheduled(10, per_batch=True, steps=240, gamma=0.5)
    (warned,) = [e for e in run.events if e.signal == "per_batch"]
    assert (warned.step, warned.severity) == (40, "warning"), warned
    assert "fell 16x in 4 drops" in warned.message
    first = run.first_failure
    assert first is not None and first.step > warned.step, first
    assert [c.kind for c in run.likely_causes] == ["per_batch"], run.likely_causes
    quiet = _scheduled(1, per_batch=False, steps=240, gamma=0.5)
    assert not [e for e in quiet.events if e.signal == "per_batch"]
    assert_no_errors(quiet)


def test_the_same_schedule_per_epoch_and_one_layer_at_lr_0_are_not_the_whole_model():
    """Stepped per epoch (every 30 steps), the schedule leaves the model learning: no
    error. One layer of three given a learning rate of 0 stays a warning of its own."""
    assert_no_errors(_scheduled(1, per_batch=False))
    run = _scheduled(10 ** 6, per_batch=False, zero_lr_layer=True)
    assert not [e for e in run.events if e.signal == "model"]
    assert_no_errors(run)


def _loader_schedule(per_batch: bool, epochs: int = 6):
    """A DataLoader of 16 batches an epoch and StepLR(step_size=2, gamma=0.5): stepped
    once an epoch the rate halves every 32 steps; stepped every batch, every 2 steps."""
    model = _backbone_and_head()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2 if per_batch else 1, gamma=0.5)
    x, y = task_batches()
    data = torch.utils.data.TensorDataset(x[:16].reshape(-1, 6), y[:16].reshape(-1))
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    with ndbg.watch(model, report=False) as run:
        for _ in range(epochs):
            for xb, yb in loader:
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
                if per_batch:
                    sched.step()
            if not per_batch:
                sched.step()
    return run


def test_a_schedule_stepped_once_an_epoch_of_few_batches_is_not_per_batch():
    """Halved at every epoch of 16 batches, the rate falls 16x in four drops 16 steps
    apart, as a step schedule stepped per batch would; the drops come at the first batch
    of an epoch (the loader's iterator is new), so it is no warning. Stepped per batch
    through the same loader, it is."""
    per_epoch = _loader_schedule(per_batch=False)
    # (the loaders are followed from the model's first call: the first epoch's start,
    # whose iterator was made before it, is not known)
    starts = per_epoch.trace.scalar("in_epoch_start")
    assert starts[16::16].tolist() == [1.0] * 5 and np.nansum(starts) == 5, starts
    assert not [e for e in per_epoch.events if e.signal == "per_batch"], per_epoch.events
    assert_no_errors(per_epoch)
    per_batch = _loader_schedule(per_batch=True)
    warned = [e for e in per_batch.events if e.signal == "per_batch"]
    assert warned and warned[0].step <= 12, [str(e) for e in per_batch.events]


def _hinge_fit(steps: int, on_step_start=None):
    """A margin classifier on separable data: the hinge loss reaches exactly 0 once every
    margin is met (about step 115), and every gradient is exactly 0 from there."""
    torch.manual_seed(0)
    x = torch.randn(64, 6)
    y = torch.sign(x[:, 0])
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with ndbg.watch(model, report=False) as run:
        for step in range(steps):
            if on_step_start is not None:
                on_step_start(step, model)
            opt.zero_grad()
            F.relu(1 - y * model(x).squeeze(1)).mean().backward()
            opt.step()
    return run


def test_an_exact_fit_whose_loss_is_exactly_0_is_not_a_cut_off_or_vanishing_gradient():
    run = _hinge_fit(160)
    loss = run.trace.scalar("loss")
    assert (loss[-30:] == 0).all() and (run.trace.col("grad_norm")[-30:, [0, 2]] == 0).all()
    assert not [e for e in run.events if e.kind in ("vanishing_gradient", "cut_off")], \
        run.events
    assert_no_errors(run)
    assert len([e for e in run.events if e.severity == "warning"]) <= 1


def test_an_exact_fit_does_not_hide_a_later_failure():
    """After the loss sat at exactly 0, the first layer's weights are shrunk 1e6x in
    place at step 150 (a bad reload): its activations collapse and the loss is back. The
    failure is named at that step and layer."""
    def shrink(step, model):
        if step == 150:
            with torch.no_grad():
                model[0].weight.mul_(1e-6)
                model[0].bias.mul_(1e-6)
    run = _hinge_fit(180, on_step_start=shrink)
    assert (run.trace.scalar("loss")[130:150] == 0).all()
    first = run.first_failure
    assert (first.layer, first.step) == ("0", 150), first


def _regression_fit(steps: int, lr: float, momentum: float, raise_at: int | None = None):
    """Two linear layers fitting a noiseless linear teacher with SGD: the head (33 weights
    of norm 0.59) must grow 5x to the targets' scale in the first steps, and the mean
    squared error then falls to the float32 floor (about 1e-13), where the updates of
    the gradients left round away. At `raise_at` the learning rate is set 1000x (a unit
    mix-up in a config)."""
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(8, 1, generator=gen)
    x = torch.randn(256, 8, generator=gen)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    with ndbg.watch(model, report=False) as run:
        for step in range(steps):
            if step == raise_at:
                for group in opt.param_groups:
                    group["lr"] *= 1000
            opt.zero_grad()
            F.mse_loss(model(x), x @ teacher).backward()
            opt.step()
    return run


@pytest.mark.parametrize("lr, momentum", [(0.05, 0.9), (0.02, 0.5)])
def test_a_regression_fitted_to_the_float_floor_is_healthy(lr, momentum):
    """The head's first updates move it by more than its size while the loss falls (a
    warning at most, `updates.LR_SIZED`); at the floor, updates that round away are not
    weights left out of the optimizer."""
    run = _regression_fit(300, lr, momentum)
    assert run.trace.scalar("loss")[-50:].max() < 1e-9
    assert_no_errors(run)
    assert not [e for e in run.events if e.kind == "weights_not_updated"], \
        [str(e) for e in run.events]
    assert len([e for e in run.events if e.severity == "warning"]) <= 1


@pytest.mark.parametrize("lr, momentum", [(0.05, 0.9), (0.02, 0.5)])
def test_a_learning_rate_raised_at_the_float_floor_is_the_first_failure(lr, momentum):
    run = _regression_fit(300, lr, momentum, raise_at=250)
    first = run.first_failure
    assert first is not None and 250 <= first.step <= 252, first
    assert [e for e in run.events if e.severity == "error" and e.step <= 255], run.events


def test_a_step_schedule_stepped_per_batch_is_a_warning_with_the_learning_rates_path():
    """Stepped every batch, StepLR(step_size=5) divides the rate 10x every 5 steps: the
    second such fall within 20 steps is a warning naming the path, long before the model
    stops learning; a schedule stepped per epoch (10x every 30 steps) and a cosine one
    are not."""
    run = _scheduled(5, per_batch=True)
    (warned,) = [e for e in run.events if e.signal == "per_batch"]
    assert (warned.step, warned.severity) == (10, "warning"), warned
    assert "0.05 -> 0.005 at step 5, 0.005 -> 0.0005 at step 10" in warned.message, \
        warned.message
    assert "once per epoch" in warned.message
    assert not [e for e in _scheduled(1, per_batch=False).events if e.signal == "per_batch"]
    model = _backbone_and_head()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=60)
    with ndbg.watch(model, report=False) as run:
        _train(model, opt, 60, on_step_start=lambda s, m, o: cosine.step() if s else None)
    assert not [e for e in run.events if e.signal == "per_batch"]
    assert_no_errors(run)
