"""The Lightning callback on real `Trainer.fit` runs: healthy runs stay quiet, faults injected
at a known step are named at that layer and step, training is bit-identical with and without
the callback, `stop_on="error"` ends the fit through `trainer.should_stop`, steps count as
Lightning's `global_step` does, the loggers and the log folder get the run."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from neuraldbg_nb.integrations.lightning import NeuralDbgCallback

HERE = Path(__file__).resolve().parent
FAULT = 30


def _data(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 20, generator=g)
    return x, (x[:, :3].sum(1) > 0).long()


class Classifier(pl.LightningModule):
    """A small MLP; `fault(step, module)` runs at the start of each training step."""

    def __init__(self, fault=None, lr: float = 0.05, manual: bool = False,
                 via_forward: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 2))
        self.fault, self.lr, self.losses = fault, lr, []
        self.automatic_optimization = not manual
        self.via_forward = via_forward  # the training step calls `self(x)`, not `self.net(x)`

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        if self.fault is not None:
            self.fault(self.global_step, self, batch)
        x, y = batch
        loss = nn.functional.cross_entropy(self(x) if self.via_forward else self.net(x), y)
        self.losses.append(loss.detach().clone())
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit(callbacks, fault=None, tmp: Path | None = None, epochs: int = 3, manual: bool = False,
        via_forward: bool = False, **trainer_kw):
    torch.manual_seed(0)
    nan = fault == nan_batch
    model = Classifier(None if nan else fault, manual=manual, via_forward=via_forward)
    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32,
                                         shuffle=True, collate_fn=NanAt() if nan else None,
                                         generator=torch.Generator().manual_seed(1))
    kw = {"max_epochs": epochs, "accelerator": "cpu", "logger": False,
          "enable_checkpointing": False, "enable_progress_bar": False,
          "enable_model_summary": False,
          "default_root_dir": str(tmp) if tmp else tempfile.mkdtemp()}
    kw.update(trainer_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer = pl.Trainer(callbacks=callbacks, **kw)
        trainer.fit(model, loader)
    return model, trainer


def scale_weights(step, module, batch):
    if step == FAULT:
        with torch.no_grad():
            module.net[2].weight.mul_(1000.0)


def raise_lr(step, module, batch):
    if step == FAULT:
        for g in module.trainer.optimizers[0].param_groups:
            g["lr"] *= 1000.0


class NanAt:
    """A collate function whose batch number FAULT (the FAULT-th optimizer step's) holds a
    NaN, as a bad record in the data would: the batch is bad before Lightning hands it on."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, rows):
        x, y = torch.utils.data.default_collate(rows)
        if self.made == FAULT:
            x[0, 0] = math.nan
        self.made += 1
        return x, y


nan_batch = "nan_batch"


def errors(run):
    return [e for e in run.events if e.severity == "error"]


def test_a_healthy_fit_stays_quiet_and_counts_lightnings_steps(tmp_path):
    cb = NeuralDbgCallback()
    _, trainer = fit([cb], tmp=tmp_path)
    assert cb.run.trace.n_steps == trainer.global_step == 48
    assert errors(cb.run) == [] and cb.run.first_failure is None
    assert cb.run.status == "finished"
    assert (tmp_path / "neuraldbg_run.npz").exists()  # no logger: the root folder


@pytest.mark.parametrize("fault", [scale_weights, raise_lr, nan_batch])
def test_training_is_bit_identical_with_the_callback(fault):
    watched, _ = fit([NeuralDbgCallback()], fault)
    plain, _ = fit([], fault)
    assert len(watched.losses) == len(plain.losses)
    for a, b in zip(watched.losses, plain.losses):
        assert torch.equal(a, b) or (a.isnan() and b.isnan())


def test_weights_changed_in_place_are_named_at_their_layer_and_step():
    cb = NeuralDbgCallback()
    fit([cb], scale_weights)
    root = cb.run.first_failure
    assert (root.layer, root.step, root.severity) == ("net.2", FAULT, "error")


@pytest.mark.parametrize("via_forward", [True, False])
def test_automatic_optimization_hooks_the_layers_at_sampled_steps_and_replays_a_fault(
        via_forward):
    """Lightning's automatic optimization gives every step a closure: the step closes when
    it returns, before the update, and its layers are hooked at sampled steps only; a
    fault at a step between them is replayed to its layer and step, also where the
    training step calls a part of the module (`self.net(x)`), whose calls are heard from
    the second step on."""
    def scale_later(step, module, batch):
        if step == FAULT + 3:  # (not a sampled step)
            with torch.no_grad():
                module.net[2].weight.mul_(1000.0)

    cb = NeuralDbgCallback()
    fit([cb], scale_later, via_forward=via_forward)
    hooked = cb.run.trace.scalar("hooked") == 1
    root = cb.run.first_failure
    assert (root.layer, root.step, root.severity) == ("net.2", FAULT + 3, "error"), root
    # (after the fault its steps go on wrong: replayed, hooked)
    assert hooked[:FAULT + 3].sum() < (FAULT + 3) / 3 and cb.run.recorder.replays > 0


def test_a_learning_rate_raised_1000x_is_named_at_its_step():
    cb = NeuralDbgCallback()
    fit([cb], raise_lr)
    root = cb.run.first_failure
    assert root is not None and root.severity == "error"
    assert root.step == FAULT, root


def test_a_nan_batch_is_the_datas_fault_at_its_step():
    cb = NeuralDbgCallback()
    fit([cb], nan_batch)
    root = cb.run.first_failure
    assert (root.kind, root.layer, root.step) == ("data_anomaly", None, FAULT)


def test_stop_on_error_ends_the_fit_cleanly_after_the_failing_step(tmp_path):
    cb = NeuralDbgCallback(stop_on="error")
    _, trainer = fit([cb], scale_weights, tmp=tmp_path)  # no exception
    assert trainer.global_step == FAULT + 1
    assert cb.run.status == "stopped"
    assert cb.run.first_failure.step == FAULT
    from neuraldbg_nb import load
    saved = load(tmp_path / "neuraldbg_run.npz")
    assert saved.first_failure.step == FAULT and saved.first_failure.layer == "net.2"


@pytest.mark.parametrize("kw", [
    {"accumulate_grad_batches": 2},
    {"gradient_clip_val": 0.5},
    {"precision": "bf16-mixed"},
], ids=["accumulation", "clipping", "bf16-mixed"])
def test_steps_are_lightnings_optimizer_steps(kw):
    cb = NeuralDbgCallback()
    _, trainer = fit([cb], **kw)
    assert cb.run.trace.n_steps == trainer.global_step > 0
    assert errors(cb.run) == []


def test_under_accumulation_the_recorded_loss_is_the_mean_of_the_micro_batches():
    cb = NeuralDbgCallback()
    model, trainer = fit([cb], epochs=1, accumulate_grad_batches=2)
    micro = torch.stack(model.losses).reshape(-1, 2).mean(dim=1)  # Lightning's logged loss
    recorded = torch.from_numpy(cb.run.trace.scalar("loss")).float()
    assert len(recorded) == trainer.global_step == len(micro)
    assert torch.allclose(recorded, micro, rtol=1e-5)


def test_manual_optimization_is_watched_step_by_step():
    cb = NeuralDbgCallback()
    _, trainer = fit([cb], scale_weights, manual=True)
    assert cb.run.trace.n_steps == trainer.global_step
    assert (cb.run.first_failure.layer, cb.run.first_failure.step) == ("net.2", FAULT)


def test_the_first_failure_and_counts_reach_the_loggers_and_the_log_folder(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb = NeuralDbgCallback()
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    _, trainer = fit([cb], scale_weights, logger=logger)
    log_dir = Path(trainer.log_dir)
    assert (log_dir / "neuraldbg_run.npz").exists()
    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert "neuraldbg/errors" in events.Tags()["scalars"]
    texts = events.Tags()["tensors"]
    assert any("neuraldbg/first_failure" in t for t in texts), texts
    first_step = events.Scalars("neuraldbg/first_failure_step")[-1].value
    assert first_step == FAULT


def test_the_callback_can_be_pickled_before_and_after_a_fit():
    import pickle

    cb = NeuralDbgCallback(stop_on="error", vanish=1e-7)
    pickle.loads(pickle.dumps(cb))
    fit([cb], epochs=1)
    again = pickle.loads(pickle.dumps(cb))
    assert again.run is None and cb.run is not None


def test_bad_options_fail_when_the_callback_is_made():
    with pytest.raises(ValueError, match="stop_on"):
        NeuralDbgCallback(stop_on="always")
    with pytest.raises(TypeError):
        NeuralDbgCallback(no_such_option=1)


@pytest.mark.distributed
def test_two_rank_ddp_through_lightnings_own_launcher(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE)])}
    out = subprocess.run([sys.executable, str(HERE / "_lightning_ddp.py"), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    from _lightning_ddp import FAULT_STEP, FAULTY_RANK

    from neuraldbg_nb import load
    runs = {r: load(tmp_path / f"neuraldbg_run.rank{r}.npz") for r in (0, 1)}
    assert runs[0].rank == (0, 2) and runs[1].rank == (1, 2)
    bad = runs[FAULTY_RANK].first_failure
    assert (bad.kind, bad.step) == ("data_anomaly", FAULT_STEP)
    assert all(e.kind != "data_anomaly" or e.severity == "info"
               for e in runs[1 - FAULTY_RANK].events)
