"""The transformers callback on real `Trainer.train()` runs of a tiny GPT-2 (no downloads):
healthy runs stay quiet, faults at a known step are named at that layer and step, training
is bit-identical with and without the callback, `stop_on="error"` ends training through
`control.should_training_stop`, the events reach every `report_to` backend, the run is saved
in `output_dir`."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from neuraldbg_nb.integrations.huggingface import NeuralDbgCallback

HERE = Path(__file__).resolve().parent
FAULT = 20
LAYER = "transformer.h.1.mlp.c_fc"


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100,
                                      n_positions=32))


def dataset(n: int = 64) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, 100, (16,), generator=g)
        rows.append({"input_ids": ids, "labels": ids})
    return rows


class Fault(TrainerCallback):
    """At the start of step FAULT: weights of LAYER x1000, or the learning rate x1000."""

    def __init__(self, what: str) -> None:
        self.what = what

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):
        if state.global_step != FAULT:
            return
        if self.what == "weights":
            with torch.no_grad():
                model.get_submodule(LAYER).weight.mul_(1000.0)
        else:
            for g in optimizer.param_groups:
                g["lr"] *= 1000.0


def train(callbacks, out: Path, steps: int = 40, report_to=(), **kw) -> Trainer:
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8,
                             max_steps=steps, logging_steps=5, report_to=list(report_to),
                             save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True,
                             learning_rate=1e-3, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=dataset(),
                          callbacks=list(callbacks))
        trainer.train()
    return trainer


def losses(trainer: Trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_a_healthy_run_stays_quiet_and_is_saved_in_output_dir(tmp_path):
    cb = NeuralDbgCallback()
    trainer = train([cb], tmp_path)
    assert cb.run.trace.n_steps == trainer.state.global_step == 40
    assert [e for e in cb.run.events if e.severity == "error"] == []
    assert (tmp_path / "neuraldbg_run.npz").exists()


@pytest.mark.parametrize("what", ["weights", "lr"])
def test_training_is_bit_identical_with_the_callback(tmp_path, what):
    watched = train([Fault(what), NeuralDbgCallback()], tmp_path / "a")
    plain = train([Fault(what)], tmp_path / "b")
    assert losses(watched) == losses(plain)
    for a, b in zip(watched.model.parameters(), plain.model.parameters()):
        assert torch.equal(a.detach(), b.detach())


def test_weights_changed_in_place_are_named_at_their_layer_and_step(tmp_path):
    cb = NeuralDbgCallback()
    train([Fault("weights"), cb], tmp_path)
    root = cb.run.first_failure
    assert (root.layer, root.step, root.severity) == (LAYER, FAULT, "error")


def test_a_learning_rate_raised_1000x_is_named_at_its_step(tmp_path):
    cb = NeuralDbgCallback()
    train([Fault("lr"), cb], tmp_path)
    root = cb.run.first_failure
    assert root is not None and root.severity == "error" and root.step == FAULT, root


def test_stop_on_error_ends_training_and_the_logs_say_why(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb = NeuralDbgCallback(stop_on="error")
    trainer = train([Fault("weights"), cb], tmp_path, report_to=["tensorboard"])
    assert trainer.state.global_step == FAULT + 1
    assert cb.run.status == "stopped" and cb.run.first_failure.step == FAULT
    runs = list((tmp_path / "runs").iterdir())
    tb = EventAccumulator(str(runs[0]))
    tb.Reload()
    scalars, texts = tb.Tags()["scalars"], tb.Tags()["tensors"]
    assert any(t.endswith("neuraldbg/errors") for t in scalars), scalars
    assert any("neuraldbg/first_failure" in t for t in texts), texts
    step_tag = next(t for t in scalars if t.endswith("neuraldbg/first_failure_step"))
    assert tb.Scalars(step_tag)[-1].value == FAULT


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    cb = NeuralDbgCallback()
    trainer = train([cb], tmp_path, steps=10, gradient_accumulation_steps=2)
    assert cb.run.trace.n_steps == trainer.state.global_step == 10


@pytest.mark.distributed
def test_two_rank_ddp_through_torchrun(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE)])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", "29531", str(HERE / "_huggingface_ddp.py"), str(tmp_path)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    from neuraldbg_nb import load
    for r in (0, 1):
        run = load(tmp_path / f"neuraldbg_run.rank{r}.npz")
        assert run.rank == (r, 2)
        assert (run.first_failure.layer, run.first_failure.step) == (LAYER, FAULT)


class Regressor(torch.nn.Module):
    """A float-input model as the Trainer takes one: `forward(x, labels)` returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))

    def forward(self, x, labels=None):
        out = self.net(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def test_a_nan_batch_is_the_datas_fault_at_its_step(tmp_path):
    g = torch.Generator().manual_seed(0)
    rows = [{"x": torch.randn(8, generator=g), "labels": torch.randn((), generator=g)}
            for _ in range(8 * 40)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8,
                             max_steps=40, report_to=[], save_strategy="no", use_cpu=True,
                             seed=0, disable_tqdm=True, dataloader_drop_last=True)
    cb = NeuralDbgCallback()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Trainer(model=Regressor(), args=args, train_dataset=rows, callbacks=[cb],
                data_collator=NanAt()).train()
    root = cb.run.first_failure
    assert (root.kind, root.layer, root.step) == ("data_anomaly", None, FAULT), root


class NanAt:
    """A collator whose batch number FAULT (the FAULT-th optimizer step's) holds one bad
    record, as a corrupt row of the data would."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, rows):
        x = torch.stack([r["x"] for r in rows])
        if self.made == FAULT:
            x[3, 2] = float("nan")
        self.made += 1
        return {"x": x, "labels": torch.stack([r["labels"] for r in rows])}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_recorded_loss_is_the_loss_the_trainer_logs(tmp_path, accumulate):
    cb = NeuralDbgCallback()
    trainer = train([cb], tmp_path, steps=10, gradient_accumulation_steps=accumulate)
    recorded = cb.run.trace.scalar("loss")
    logged = losses(trainer)  # each the mean over a window of logging_steps=5 steps
    assert len(logged) == 2
    for window, value in zip((recorded[:5], recorded[5:]), logged):
        assert float(window.mean()) == pytest.approx(value, rel=1e-5)


def test_a_training_that_raises_ends_the_watch_with_its_error(tmp_path):
    """transformers tells a callback of no exception: `train()` raising (a label out of
    the vocabulary, in the batch that holds it) still ends the watch, its hooks removed and the run
    saved, and the error is the user's, as without the callback."""
    rows = dataset()
    rows[FAULT] = {**rows[FAULT], "labels": torch.full((16,), 1000)}
    cb = NeuralDbgCallback()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8,
                             max_steps=40, report_to=[], save_strategy="no", use_cpu=True,
                             seed=0, disable_tqdm=True)
    model = tiny_gpt2()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=[cb])
        with pytest.raises((IndexError, RuntimeError)):
            trainer.train()
    assert cb.run.status == "raised" and cb.run.exception is not None
    assert cb.run.trace.n_steps < 40
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert (tmp_path / "neuraldbg_run.npz").exists()
    # a Trainer copied to another process (pickled) carries its own train(), no watch
    rebuild, args = trainer.train.__reduce__()
    assert rebuild(*args).__func__ is Trainer.train
