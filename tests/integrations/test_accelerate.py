"""`watch()` around a loop that trains through accelerate (`accelerator.backward`,
`accelerator.accumulate`, bf16 autocast, `clip_grad_norm_`): steps are the optimizer's,
healthy runs stay quiet, a fault at a known step is named there, and training is
bit-identical with and without the watch."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import neuraldbg_nb as ndbg

FAULT = 15


def loop(watched: bool, *, accumulate: int = 1, precision: str = "no", clip: bool = False,
         fault: str | None = None, steps: int = 40):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state()
    torch.manual_seed(0)
    acc = Accelerator(cpu=True, mixed_precision=precision, gradient_accumulation_steps=accumulate)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * accumulate * 16, 20, generator=g)
    y = (x[:, :3].sum(1) > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model, opt, loader = acc.prepare(model, opt, loader)
    losses, updates = [], 0

    def train(run=None):
        nonlocal updates
        for xb, yb in loader:
            with acc.accumulate(model):
                if fault == "nan" and updates == FAULT:
                    xb = xb.clone()
                    xb[0, 0] = math.nan
                if fault == "weights" and updates == FAULT and acc.sync_gradients:
                    with torch.no_grad():
                        model[2].weight.mul_(1000.0)
                loss = nn.functional.cross_entropy(model(xb), yb)
                losses.append(loss.detach().float().clone())
                acc.backward(loss)
                if clip and acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                opt.zero_grad()
                updates += acc.sync_gradients

    if watched:
        with ndbg.watch(model, report=False) as run:
            train(run)
        return losses, run, updates
    train()
    return losses, None, updates


@pytest.mark.parametrize("kw", [{}, {"accumulate": 2}, {"precision": "bf16"}, {"clip": True}],
                         ids=["plain", "accumulation", "bf16", "clipping"])
def test_healthy_and_bit_identical(kw):
    watched, run, updates = loop(True, **kw)
    plain, _, _ = loop(False, **kw)
    assert all(torch.equal(a, b) for a, b in zip(watched, plain)) and len(watched) == len(plain)
    assert run.trace.n_steps == updates == 40
    assert [e for e in run.events if e.severity == "error"] == []


@pytest.mark.parametrize("accumulate", [1, 2])
def test_weights_changed_in_place_are_named_at_their_step(accumulate):
    _, run, _ = loop(True, accumulate=accumulate, fault="weights")
    root = run.first_failure
    assert (root.layer, root.step, root.severity) == ("2", FAULT, "error")


def test_a_nan_batch_is_the_datas_fault():
    _, run, _ = loop(True, fault="nan")
    root = run.first_failure
    assert (root.kind, root.step) == ("data_anomaly", FAULT)
