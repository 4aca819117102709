"""Healthy training must stay quiet: no error event, at most one warning, no first failure.

Each architecture is trained for 200 steps with a sane learning rate on data with 10%
label noise (as real data has), and checked to actually learn. A second set trains on
the clean data, where the model fits its batches almost perfectly and the per-batch
gradient norm keeps fluctuating: that is still healthy training.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from models import FACTORIES, train
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.watcher import ScanSchedule

STEPS = 200


def _train_watched(arch: str, label_noise: float, seed: int = 0):
    setup = FACTORIES[arch](seed, label_noise=label_noise)
    with ndbg.watch(setup.model, report=False) as run:
        losses = train(setup, STEPS)
    return setup, run, torch.stack(losses)


def _assert_quiet(run, losses):
    first, last = losses[:20].mean().item(), losses[-20:].mean().item()
    assert last < 0.7 * first, f"the model did not learn ({first:.3f} -> {last:.3f})"
    loud = [e for e in run.events if e.severity in ("warning", "error")]
    errors = [str(e) for e in loud if e.severity == "error"]
    assert not errors, f"error events on healthy training: {errors}"
    assert len(loud) <= 1, (f"{len(loud)} warnings on healthy training, kinds "
                            f"{sorted({(e.kind, e.signal) for e in loud})}; first ones: "
                            f"{[str(e) for e in loud[:5]]}")
    assert run.first_failure is None
    assert run.trace.n_steps == STEPS
    assert run.status == "finished"


@pytest.mark.parametrize("arch", list(FACTORIES))
def test_healthy_training_is_quiet(arch):
    _, run, losses = _train_watched(arch, label_noise=0.1)
    _assert_quiet(run, losses)


@pytest.mark.parametrize("arch", list(FACTORIES))
def test_healthy_training_to_a_near_perfect_fit_is_quiet(arch):
    _, run, losses = _train_watched(arch, label_noise=0.0)
    _assert_quiet(run, losses)


def test_healthy_runs_record_every_layer_every_step():
    _, run, _ = _train_watched("cnn", label_noise=0.1)
    names = run.trace.layer_names
    # forward execution order; dropout-like/reshape modules are not layers
    assert names[:6] == ["0", "1", "2", "3", "4", "5"]
    assert "7" not in names  # nn.Flatten
    a = run.trace.col("act_absmax")
    assert torch.isfinite(torch.from_numpy(a)).all()
    g = run.trace.col("grad_norm")
    for i, info in enumerate(run.trace.layers):
        if info.has_params:
            assert (g[:, i] > 0).all(), f"{info.name}: grad norm missing or zero"
    loss = run.trace.scalar("loss")
    assert (loss > 0).all() and (loss < 10).all()



def test_a_pause_between_steps_does_not_make_every_step_scan():
    # the live run's scan schedule on a 35 ms step, a 3 ms scan and a 5 s pause (an
    # evaluation pass, or the same watch entered again in the next cell)
    schedule = ScanSchedule(ndbg.Thresholds())
    now = 1000.0
    for _ in range(30):
        now += 0.035
        schedule._time_step(now)
    schedule.scanned(0.003)
    before = schedule.interval
    now += 5.0
    schedule._time_step(now)
    schedule.scanned(0.003)
    assert before >= 80  # 3 ms in batches of BUDGET (0.1%) of 35 ms steps
    # counted as a step, the pause made the average 0.5 s and the batches one step long
    assert schedule.interval >= 0.8 * before


def _binary(hidden: nn.Module):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 20, generator=gen)
    y = (x @ torch.randn(20, generator=gen) > 0).float()[:, None]
    model = nn.Sequential(nn.Linear(20, 64), hidden, nn.Linear(64, 1), nn.Sigmoid())
    return model, x, y


def _train_binary(model, x, y, steps: int, on_step_start=None):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        if on_step_start is not None:
            on_step_start(step)
        i = (step * 64) % len(x)
        opt.zero_grad()
        F.binary_cross_entropy(model(x[i:i + 64]), y[i:i + 64]).backward()
        opt.step()


def test_a_confident_classifiers_output_sigmoid_is_not_saturated():
    """The final sigmoid of a binary classifier that learned is at its bounds by design;
    judged for saturation like a hidden one, it gave a warning on healthy runs. A hidden
    bounded activation driven into saturation is still found, at its layer and step."""
    model, x, y = _binary(nn.ReLU())
    with ndbg.watch(model, report=False) as run:
        _train_binary(model, x, y, 400)
    assert ((model(x) > 0.5).float() == y).float().mean() > 0.97, "it learned"
    assert not [str(e) for e in run.events if e.severity != "info"]
    assert run.trace.layers[3].role == "other"

    model, x, y = _binary(nn.Tanh())

    def saturate(step):
        if step == 150:
            with torch.no_grad():
                model[0].weight.mul_(50)

    with ndbg.watch(model, report=False) as run:
        _train_binary(model, x, y, 200, on_step_start=saturate)
    found = [(e.step, e.layer) for e in run.events if e.kind == "saturation"]
    assert found and found[0] == (150, "1"), found
    assert run.trace.layers[1].role == "bounded"
