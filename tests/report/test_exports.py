"""A run's events exported to TensorBoard and Weights & Biases, read back from what was
written: each event at its step, the first failure marked, gradient norms on request."""

from __future__ import annotations

import os

import pytest
import torch
from models import mlp, train

import neuraldbg_nb as ndbg

FAULT = 25


def broken_run() -> ndbg.Run:
    setup = mlp()

    def scale(step, model, opt):
        if step == FAULT:
            with torch.no_grad():
                model.get_submodule(setup.layers["mid"]).weight.mul_(1000.0)

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 40, on_step_start=scale)
    assert run.first_failure is not None and run.first_failure.step == FAULT
    return run


def test_to_tensorboard_writes_the_events_at_their_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = broken_run()
    assert run.to_tensorboard(tmp_path, grad_norms=True) == tmp_path
    tb = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0, "scalars": 0})
    tb.Reload()
    texts = {t: tb.Tensors(t) for t in tb.Tags()["tensors"]}
    first = next(v for t, v in texts.items() if "neuraldbg/first_failure" in t)
    assert first[0].step == FAULT
    events = next(v for t, v in texts.items() if "neuraldbg/events" in t)
    marked = [e for e in events if b"**first failure**" in e.tensor_proto.string_val[0]]
    assert [e.step for e in marked] == [FAULT]
    assert {e.step for e in events} == {e.step for e in run.events}
    errors = tb.Scalars("neuraldbg/errors")
    assert errors[-1].value == sum(e.severity == "error" for e in run.events)
    layer = run.trace.layer_names[0]
    norms = tb.Scalars(f"neuraldbg/grad_norm/{layer}")
    assert len(norms) == run.trace.n_steps


def test_to_tensorboard_takes_a_writer_of_the_users(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    run = broken_run()
    with SummaryWriter(str(tmp_path)) as writer:
        writer.add_scalar("loss", 1.0, 0)
        assert run.to_tensorboard(writer) is None  # the user's writer stays open
        writer.add_scalar("loss", 0.5, 1)


def test_to_wandb_logs_a_table_and_the_first_failure_offline(tmp_path, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = broken_run()
    with wandb.init(project="neuraldbg-test", dir=str(tmp_path)) as wb:
        run.to_wandb(wb, grad_norms=True)
        assert wb.summary["neuraldbg/first_failure_step"] == FAULT
        assert wb.summary["neuraldbg/errors"] == sum(e.severity == "error" for e in run.events)
        assert run.first_failure.message == wb.summary["neuraldbg/first_failure"]
    assert any(name.endswith(".wandb") for _, _, files in os.walk(tmp_path) for name in files)


def test_to_wandb_without_a_run_says_what_to_do():
    import wandb

    if wandb.run is not None:
        pytest.skip("a W&B run is active in this process")
    with pytest.raises(RuntimeError, match="wandb.init"):
        broken_run().to_wandb()
