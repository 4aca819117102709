"""The input batch in real trainings (`data_anomaly`): a loader stuck at a step, full-batch
training, one-hot batches told apart from repeats, and inputs that drift a little every
step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from faults import STEPS, S
from models import FACTORIES, train

import neuraldbg_nb as ndbg


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_a_loader_stuck_at_a_step_is_a_warning_there_and_full_batch_training_is_info(arch):
    setup = FACTORIES[arch]()
    fed = setup.batch
    setup.batch = lambda step: fed(min(step, S - 1))  # step S gets step S-1's batch again
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS)
    found = [(e.step, e.severity, e.signal) for e in run.events if e.kind == "data_anomaly"]
    assert found == [(S, "warning", "input_repeat")]

    setup = FACTORIES[arch]()
    fed = setup.batch
    setup.batch = lambda step: fed(0)  # full-batch training: one batch, every step
    with ndbg.watch(setup.model, report=False) as run:
        losses = train(setup, STEPS)
    assert losses[-1] < 0.5 * losses[0], "it fits its batch"
    found = [(e.step, e.severity, e.signal) for e in run.events if e.kind == "data_anomaly"]
    assert found == [(1, "info", "input_repeat")]
    assert not [str(e) for e in run.events if e.severity != "info"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_hot_batches_are_repeats_only_where_they_repeat(dtype):
    """Online training on one-hot inputs (batch size 1): every batch has the same min,
    max and sum, so only the weighted sum of the fingerprint tells them apart (a strided
    sum, of every third element, would read 172 of 299 steps as repeats where 13 are).
    Exactly the true repeats are counted."""
    gen = torch.Generator().manual_seed(0)
    hot = torch.randint(0, 300, (120,), generator=gen)
    hot[50] = hot[49]  # one true repeat
    target = torch.randn(300, generator=gen)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ndbg.watch(model, report=False) as run:
        for i in hot.tolist():
            x = torch.nn.functional.one_hot(torch.tensor([i]), 300).to(dtype)
            loss = (model(x).float().squeeze() - target[i]) ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
    repeats = run.trace.scalar("in_repeat")
    true = [s for s in range(1, len(hot)) if hot[s] == hot[s - 1]]
    assert np.flatnonzero(repeats > 0).tolist() == true
    assert 50 in true


def test_batches_of_one_hot_states_are_told_apart():
    """A DQN-like loop: batches of 16 one-hot states out of 6. With weights 0, 1, 2, ...
    in the fingerprint, two batches whose hot positions add up alike would be the same
    batch (7 warnings "repeats the previous batch exactly" in 300 steps, none true): no
    batch here repeats, and none is said to."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    values = torch.randn(6, 3, generator=gen)
    states = torch.randint(0, 6, (300, 16), generator=gen)
    with ndbg.watch(model, report=False) as run:
        for s in states:
            x = torch.nn.functional.one_hot(s, 6).float()
            loss = torch.nn.functional.mse_loss(model(x), values[s])
            opt.zero_grad()
            loss.backward()
            opt.step()
    true = [t for t in range(1, len(states)) if torch.equal(states[t], states[t - 1])]
    assert np.flatnonzero(run.trace.scalar("in_repeat") > 0).tolist() == true == []
    assert [str(e) for e in run.events if e.kind == "data_anomaly"] == []


def test_inputs_that_drift_a_little_every_step_are_the_first_failure():
    """Inputs scaled 1.06x more at every step from step 100 (an accumulating transform):
    no step is a jump, and what breaks is a layer's gradient at step 235. The drift is
    found once its level moved 100x (judged from step 205, 200 steps after the first
    level), and is the first failure: the gradient that breaks after it is its symptom."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    teacher = torch.randn(32, 10, generator=gen)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ndbg.watch(model, report=False) as run:
        for step in range(240):
            x = torch.randn(64, 32, generator=gen)
            y = (x @ teacher).argmax(1)
            if step >= 100:
                x = x * 1.06 ** (step - 100)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    ff = run.first_failure
    assert ff is not None and (ff.kind, ff.signal, ff.step) == ("data_anomaly", "input_drift", 205)
    assert "drifted" in str(run).splitlines()[0]
