"""Gradients in real trainings: a gradient made non-finite in the backward is the cause, not
the update that carries it into the weights (`nonfinite_gradient`)."""

from __future__ import annotations

import torch
from faults import STEPS, S

import neuraldbg_nb as ndbg


class _L2Norm(torch.nn.Module):
    """Rows scaled to unit length, the square root's derivative at 0 unguarded."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(d))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.scale * h / (torch.sqrt((h * h).sum(1, keepdim=True)) + 1e-6)


def test_a_gradient_made_non_finite_in_the_backward_is_the_cause_not_the_update():
    """One all-zero sample at step 40 (padding) through layers without bias: an L2 norm's
    square root meets 0, its backward makes NaN gradients for the layer before it, and
    the update carries them into the weights. The first failure is the layer's gradient,
    at that step, not the update ("weights became non-finite during step 40 (learning
    rate 0.001)", which would blame the learning rate)."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64, bias=False), _L2Norm(64),
                                torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    teacher = torch.randn(32, 10, generator=gen)
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            x = torch.randn(64, 32, generator=gen)
            y = (x @ teacher).argmax(1)
            if step == S:
                x[5] = 0.0
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    ff = run.first_failure
    assert (ff.kind, ff.layer, ff.step) == ("nonfinite_gradient", "2", S), ff.message
    assert "learning rate" not in ff.message


def test_weights_a_vanished_gradient_cannot_move_are_said_to_round_away():
    """A 15-layer sigmoid stack: the first layers' gradients (1e-12) make updates that
    round away in float32, so their weights stay exactly as they were. The sentence says
    that, not that they are left out of the optimizer or have a learning rate of 0."""
    from torch import nn

    torch.manual_seed(15)
    layers = [nn.Linear(16, 48), nn.Sigmoid()]
    for _ in range(13):
        layers += [nn.Linear(48, 48), nn.Sigmoid()]
    model = nn.Sequential(*layers, nn.Linear(48, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(400, 16, generator=gen), torch.randint(0, 10, (400,), generator=gen)
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            i = step * 32 % 368
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
            opt.step()
    first = run.first_failure
    assert first is not None and first.kind == "vanishing_gradient", first
    stalled = [e for e in run.events if e.kind == "weights_not_updated"]
    assert stalled and stalled[0].layer == "0", [str(e) for e in run.events[:5]]
    assert all("rounds away" in e.message and "not in the optimizer" not in e.message
               for e in stalled), [e.message for e in stalled]
