"""Activations in real trainings: -inf as a mask from the first step and as a fault later
(`nonfinite_activation`), and units that die after the learning rate is raised, dated from
when they began (`dead_units`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from faults import STEPS, S
from models import measured

import neuraldbg_nb as ndbg


class _MaskHead(torch.nn.Module):
    """The logits of illegal actions set to -inf: a mask by design."""

    def forward(self, z: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
        return z.masked_fill(~legal, float("-inf"))


class _LogHead(torch.nn.Module):
    """log of probabilities: -inf where one underflows to 0 (the fault injected below)."""

    zero_at: int | None = None

    def forward(self, z: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(z, -1)
        if self.zero_at is not None:
            p = p * (torch.arange(p.shape[-1]) != self.zero_at)
        return torch.log(p)


@pytest.mark.parametrize("head", ["mask", "mask, NaN weight at S", "log, -inf at S"])
def test_minus_inf_is_a_mask_from_the_first_step_and_a_fault_later(head):
    """A layer whose output holds -inf from its first call (illegal actions' logits, a
    masked attention score) masks by design: no non-finite error at every step. A NaN in
    it is still one, and so is -inf in a layer whose output was finite before (a log
    of a probability that underflowed to 0), at its layer and step."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    last = _LogHead() if head.startswith("log") else _MaskHead()
    teacher = torch.randn(20, 10, generator=gen)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    model = torch.nn.ModuleDict({"net": net, "head": last})
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            x = torch.randn(128, 20, generator=gen)
            legal = torch.rand(128, 10, generator=gen) < 0.5
            legal[:, 0] = True
            if step == S and "NaN" in head:
                with torch.no_grad():
                    net[2].weight[0, 0] = math.nan
            if step == S and head.startswith("log"):
                last.zero_at = 3
            out = last(net(x), legal)
            target = (x @ teacher).masked_fill(~legal, float("-inf")).argmax(1)
            loss = torch.nn.functional.nll_loss(out, target) if head.startswith("log") else \
                torch.nn.functional.cross_entropy(out, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            last.zero_at = None
    ff = run.first_failure
    if head == "mask":
        assert ff is None and not [str(e) for e in run.events if e.severity == "error"]
        assert np.isfinite(measured(run)).all()
    elif "NaN" in head:
        assert (ff.step, ff.layer, ff.kind) == (S, "net.2", "nonfinite_activation"), ff
    else:
        assert (ff.step, ff.layer, ff.kind) == (S, "head", "nonfinite_activation"), ff


class _Spiking(torch.nn.Linear):
    """A linear layer whose output is 1e30 times too large at one step (`at`)."""

    at: int | None = None
    step = -1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y * 1e30 if self.step == self.at else y


class _TwoBranches(torch.nn.Module):
    """Two inputs, each through its own layer, mixed by `mix` and squashed by a tanh."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 32), torch.nn.Linear(4, 32)
        self.mix, self.head = _Spiking(64, 32), torch.nn.Linear(32, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        h = torch.cat([torch.relu(self.a(batch["x"])), torch.relu(self.b(batch["z"]))], 1)
        return self.head(torch.tanh(self.mix(h)))


@pytest.mark.parametrize("spike", [True, False])
def test_a_spike_that_a_saturated_tanh_hides_from_the_loss_is_named_at_its_step(spike):
    """A layer's output 1e30 times too large for one step that is not hooked, squashed by
    the tanh after it: the loss reads an ordinary step and the gradients' total barely
    moves (the head carries most of it), but every gradient before the tanh is cut to
    exactly 0 there. The step is replayed, and its layer and step named."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = _TwoBranches()
    model.mix.at = S + 3 if spike else None  # (not a sampled step)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            model.mix.step = step
            x, z = torch.randn(64, 6, generator=gen), torch.randn(64, 4, generator=gen)
            loss = torch.nn.functional.cross_entropy(model({"x": x, "z": z}),
                                                     (x[:, 0] > z[:, 0]).long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    if not spike:
        assert run.first_failure is None and run.recorder.replays == 0
        return
    assert run.trace.scalar("sampled")[S + 3] == 0
    assert losses[S + 3] < 2 * max(losses[S - 5:S + 3])  # the loss says nothing
    ff = run.first_failure
    assert ff is not None and (ff.step, ff.layer) == (S + 3, "mix"), ff
    assert run.recorder.replays == 1


class _SqrtFeatures(torch.nn.Module):
    """No weights of its own: a child layer, then its own code, a square root of the
    child's output shifted by `shift` (NaN where it goes below 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.shift = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.lin(x)
        return torch.sqrt(z.abs() + 1.0 - self.shift)


class _Scaled(torch.nn.Module):
    """A model's root with no weights of its own: its layers in a dict, its last line a
    division by `scale`, and a last block that returns its child's output as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleDict({
            "stem": torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh()),
            "mid": _SqrtFeatures(),
            "head": _Through(torch.nn.Linear(32, 4))})
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.blocks
        return b["head"](b["mid"](b["stem"](x))) / self.scale


class _Through(torch.nn.Module):
    """A wrapper whose output is its child's, unchanged, except where `broken`: then its
    own code takes the log of it, shifted below 0."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.fc = inner
        self.broken = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return torch.log(y - 1e3) if self.broken else y


@pytest.mark.parametrize("where,at", [("mid", S), ("mid", S + 3), ("root", S + 3),
                                      ("head", S + 3), ("none", 0)])
def test_a_value_gone_wrong_in_a_modules_own_code_around_its_children_is_its_own(where, at):
    """A module without weights of its own whose forward does maths around its children
    (`layers.composite`): a square root of a negative value in it, a log in a wrapper
    whose own code runs only at the fault's step (it passes its child's output on at the
    others), or a division by zero in the root's last line, is named after that module
    at its step (a sampled step, and one that is not, found by the replay), not after
    the layer its output goes to next, nor the loss. A module's row comes after its
    children's in forward order."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = _Scaled()
    teacher = torch.randn(16, 4, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            if step == at and where == "mid":
                model.blocks["mid"].shift = 50.0
            if step == at and where == "root":
                model.scale = 0.0
            model.blocks["head"].broken = step == at and where == "head"
            x = torch.randn(64, 16, generator=gen)
            loss = torch.nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            model.blocks["mid"].shift, model.scale = 0.0, 1.0
    names = run.trace.layer_names
    assert names.index("blocks.mid") == names.index("blocks.mid.lin") + 1
    assert names.index("blocks.head") == names.index("blocks.head.fc") + 1
    ff = run.first_failure
    if where == "none":
        assert ff is None and not [str(e) for e in run.events if e.severity == "error"], ff
        return
    layer = {"mid": "blocks.mid", "head": "blocks.head", "root": "_Scaled"}[where]
    assert ff is not None and (ff.step, ff.layer, ff.kind) == (at, layer,
                                                               "nonfinite_activation"), ff
    assert names.index(layer) > names.index("blocks.head.fc") or where == "mid"
    assert names.index("blocks.head") < names.index("_Scaled")
    if at != S:
        assert run.trace.scalar("sampled")[at] == 0 and run.recorder.replays >= 1


def test_units_dying_after_a_learning_rate_raised_tenfold_are_dated_when_they_began():
    """SGD with momentum, the learning rate raised 10x at step 100 (0.05 -> 0.5): the
    third layer's units die, 71% by the sampled step 110 (a warning), and cross the error
    line (90%) only at step 250. The first failure is the layer's dying from step 110,
    the first sample after the change, not the step where it became an error."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    teacher = torch.randn(32, 8, generator=gen)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with ndbg.watch(model, report=False) as run:
        for step in range(300):
            x = torch.randn(128, 32, generator=gen)
            y = (x @ teacher + 0.5 * torch.randn(128, 8, generator=gen)).argmax(1)
            if step == 100:
                for group in opt.param_groups:
                    group["lr"] *= 10
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    ff = run.first_failure
    assert ff is not None and 100 <= ff.step <= 110, ff
    assert any(e.kind == "dead_units" and e.severity == "error" and e.step > 200
               for e in run.events)
    assert "the learning rate went 0.05 -> 0.5 at step 100" in str(run)  # named beside it


class _Block(torch.nn.Module):
    """A residual block that calls one ReLU module after each of its convolutions (as
    torchvision's BasicBlock does), and one pooling module twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.relu = torch.nn.ReLU()
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(8 * 2 * 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(self.relu(self.conv1(x)))
        h = self.pool(self.relu(self.conv2(h) + h))
        return self.fc(h.flatten(1))


@pytest.mark.parametrize("fault", ["NaN weight", "weights x1000"])
@pytest.mark.parametrize("at", [S, S + 3])
def test_a_fault_between_two_calls_of_one_module_is_the_layer_that_made_it(fault, at):
    """A weightless module a forward calls twice is measured at its first call, where it
    sits in forward order: what goes wrong in the layer between its two calls is that
    layer's, not the reused module's (whose first call came before it)."""
    torch.manual_seed(0)
    model = _Block()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4, 8, 8, generator=gen)
    y = torch.randint(0, 3, (8,), generator=gen)
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            if step == at:
                with torch.no_grad():
                    if fault == "NaN weight":
                        model.conv2.weight[0, 0, 0, 0] = math.nan
                    else:
                        model.conv2.weight.mul_(1000)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    first = run.first_failure
    assert first is not None and (first.layer, first.step) == ("conv2", at), \
        [str(e) for e in run.events[:6]]
