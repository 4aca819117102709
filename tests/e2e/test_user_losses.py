"""Losses as users know them: under a GradScaler the recorded loss is the unscaled one,
with no `run.log_loss` call, so a float32 training followed by the same recipe under AMP
is one continuous loss curve, not a 65536x "divergence"."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from loops import assert_no_errors
from models import mlp

import neuraldbg_nb as ndbg


def test_a_float32_training_then_the_same_recipe_under_amp_is_one_loss_without_divergence():
    setup = mlp()
    model = setup.model
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    losses = []
    with ndbg.watch(model, report=False) as run:
        for step in range(80):
            x, y = setup.batch(step)
            opt.zero_grad()
            if step < 40:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            else:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            losses.append(loss.detach().float())
    recorded = run.trace.scalar("loss")
    np.testing.assert_allclose(recorded, torch.stack(losses).double().numpy(), rtol=1e-3)
    assert not [e for e in run.events if e.kind == "loss_divergence"], run.events
    assert_no_errors(run)


def test_a_loss_weighted_by_a_tensor_is_recorded_as_called():
    """A loss times a weight tensor is not a GradScaler's scaling: the tensor backward() was
    called on is the loss recorded."""
    setup = mlp()
    model = setup.model
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    weight = torch.tensor(0.5)
    heard = []
    with ndbg.watch(model, report=False) as run:
        for step in range(10):
            x, y = setup.batch(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y) * weight
            loss.backward()
            opt.step()
            heard.append(loss.item())
    np.testing.assert_allclose(run.trace.scalar("loss"), heard, rtol=1e-6)


AMP_SCRIPT = """
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cpu")
g = torch.Generator().manual_seed(0)
x, y = torch.randn(256, 10, generator=g), torch.randint(0, 4, (256,), generator=g)
for step in range(80):
    i = torch.arange(step * 32, step * 32 + 32) % 256
    opt.zero_grad()
    if step < 40:  # float32 first
        F.cross_entropy(model(x[i]), y[i]).backward()
        opt.step()
    else:  # then the same recipe under AMP
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x[i]), y[i])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
"""


def test_the_same_under_neuraldbg_run_records_the_unscaled_loss(tmp_path) -> None:
    """`neuraldbg run` finds the model itself (no model given): the GradScaler's scaled
    backwards still give the loss unscaled."""
    from neuraldbg_nb import cli

    script = tmp_path / "train.py"
    script.write_text(AMP_SCRIPT)
    saved = tmp_path / "out.npz"
    assert cli.main(["run", "--save", str(saved), str(script)]) == 0
    run = ndbg.load(saved)
    loss = run.trace.scalar("loss")
    assert run.trace.n_steps == 80 and np.isfinite(loss).all()
    assert loss[40:].max() < 10 * loss[:40].max(), loss  # no 65536x jump at step 40
    assert not [e for e in run.events if e.kind == "loss_divergence"], run.events
    assert_no_errors(run)
