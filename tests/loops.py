"""Small training loops for the end-to-end tests of odd models and loops: a 6-feature,
2-class task (`task_batches`, trained by `task_loop`), a plain SGD loop over a
`models.Setup` (`setup_loop`), a watched SGD loop over fixed tensors (`watched_sgd`), and a
fault injected at step S of STEPS (`scale_weight_at`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import neuraldbg_nb as ndbg

S = 30
STEPS = 45


def task_batches(seed: int = 0, n: int = 400):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, 6, generator=gen)
    y = (x[:, :, 0] + x[:, :, 1] > 0).long()
    return x, y


def scale_weight_at(model: nn.Module, layer: str, step: int, factor: float = 1000.0):
    def hit(s, m, o):
        if s == step:
            with torch.no_grad():
                model.get_submodule(layer).weight.mul_(factor)
    return hit


def task_loop(model: nn.Module, steps: int, *, opt=None, out_to_logits=lambda o: o,
          on_step_start=None, lr: float = 0.05, zero=None):
    """Train `model` on a fixed 6-feature, 2-class task; returns the losses."""
    x, y = task_batches()
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


def assert_no_errors(run) -> None:
    errors = [str(e) for e in run.events if e.severity == "error"]
    assert not errors, errors


def relu_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16),
                         nn.ReLU(inplace=True), nn.Linear(16, 2))


def setup_loop(setup, steps, *, opt=None, on_step_start=None, zero=None):
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


def setup_with_model(setup, model):
    from dataclasses import replace
    return replace(setup, model=model)


def watched_sgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float,
                **watch_kw) -> tuple[ndbg.Run, list[float]]:
    """`steps` steps of SGD with momentum 0.9 on batches of 32 taken in turn from (x, y),
    cross-entropy, under `watch(model, **watch_kw)`: the run and the step losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    with ndbg.watch(model, report=False, **watch_kw) as run:
        for s in range(steps):
            i = torch.arange(s * 32, s * 32 + 32) % len(x)
            loss = F.cross_entropy(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return run, losses
