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
