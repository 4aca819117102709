"""Inputs fed as they are: raw pixels (0-255) and features of order 1000 are named at
step 0 as the cause of the failure they lead to; a DataLoader whose iterator is made anew
every step (`next(iter(loader))` inside the loop) is an error, with shuffle=False and
shuffle=True, while a loop that goes through its loader (and peeks at a validation batch
each step) stays quiet; a layer that only carried a heavy-tailed batch's jump is not a
regime shift of its own."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from loops import assert_no_errors, watched_sgd
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import neuraldbg_nb as ndbg
from neuraldbg_nb.record import loaders


def _images(raw: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """512 grey 12x12 images of 4 classes, in 0-255 (`raw`) or in [0, 1]."""
    g = torch.Generator().manual_seed(0)
    proto = torch.rand(4, 1, 12, 12, generator=g)
    y = torch.randint(0, 4, (512,), generator=g)
    x = ((proto[y] + 0.3 * torch.rand(512, 1, 12, 12, generator=g)).clamp(0, 1) * 255).round()
    return (x if raw else x / 255), y


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 10 * 10, 32), nn.ReLU(), nn.Linear(32, 4))


@pytest.mark.parametrize("lr", [0.01, 0.05])
def test_raw_pixels_are_the_first_failure_at_step_0(lr):
    run, _ = watched_sgd(_cnn(), *_images(raw=True), 60, lr)
    ff = run.first_failure
    assert (ff.kind, ff.signal, ff.layer, ff.step) == ("data_anomaly", "input_raw", None, 0), ff
    assert "abs-max 255" in ff.message and "divide the pixels by 255" in ff.message
    assert [e for e in run.events if e.severity == "error"], "the run then fails"


def test_the_same_pixels_divided_by_255_stay_quiet():
    run, _ = watched_sgd(_cnn(), *_images(raw=False), 60, 0.05)
    assert_no_errors(run)
    assert [e for e in run.events if e.severity == "warning"] == []
    assert [e for e in run.events if e.signal == "input_raw"] == []


def _tabular(scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Features of order `scale` (prices, areas, counts), a label from a linear rule."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(512, 10, generator=g)
    y = (z @ torch.randn(10, 3, generator=g)).argmax(1)
    return z * scale + 3 * scale, y


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 3))


def test_features_of_order_1000_are_the_first_failure_and_standardised_ones_are_quiet():
    run, _ = watched_sgd(_mlp(), *_tabular(1000.0), 60, 0.01)
    ff = run.first_failure
    assert (ff.kind, ff.signal, ff.layer, ff.step) == ("data_anomaly", "input_raw", None, 0), ff
    assert "standardise each feature" in ff.message
    run, _ = watched_sgd(_mlp(), *_tabular(1.0), 60, 0.01)  # order 1-10: as they are
    assert_no_errors(run)
    assert [e for e in run.events if e.severity == "warning"] == []


def test_a_model_that_normalises_its_raw_input_itself_is_quiet():
    model = nn.Sequential(nn.BatchNorm1d(10), _mlp())
    run, _ = watched_sgd(model, *_tabular(1000.0), 60, 0.01)
    assert_no_errors(run)
    assert [e for e in run.events if e.signal == "input_raw"] == []


# -- the loader's iterator ----------------------------------------------------------------
def _loader(shuffle: bool) -> DataLoader:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(512, 10, generator=g)
    y = (x[:, :3]).argmax(1)
    return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(3))


def _loop(loader: DataLoader, steps: int, *, fresh: bool, val: DataLoader | None = None,
          watched: bool = True) -> tuple[ndbg.Run | None, list[float]]:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    ctx = ndbg.watch(model, report=False) if watched else None
    run = ctx.__enter__() if ctx is not None else None
    try:
        it = iter(loader)
        for _ in range(steps):
            if fresh:
                x, y = next(iter(loader))  # the bug: a new iterator, its first batch
            else:
                try:
                    x, y = next(it)
                except StopIteration:  # the epoch ended
                    it = iter(loader)
                    x, y = next(it)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if val is not None:
                with torch.no_grad():
                    vx, _ = next(iter(val))  # one validation batch peeked at
                    model(vx)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return run, losses


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_iterator_made_anew_every_step_is_the_first_failure(shuffle):
    loader = _loader(shuffle)
    run, losses = _loop(loader, 40, fresh=True, val=_loader(False))
    ff = run.first_failure
    assert (ff.kind, ff.signal, ff.layer, ff.severity) == (
        "data_anomaly", "input_reiter", None, "error"), ff
    # the watch hears the loader from its first batch on: step 0's iterator was made
    # before it, step 1's is the first it sees made anew
    assert ff.step == 1, ff
    assert "of 16 in an epoch" in ff.message and "for x, y in loader" in ff.message
    if not shuffle:  # the same first batch every step: the repeat says so too, as info
        assert {e.severity for e in run.events if e.signal == "input_repeat"} == {"info"}
    assert DataLoader.__iter__ is loaders._ORIGINAL, "the class is restored at the end"
    assert "_iter" not in vars(loader) and pickle.loads(pickle.dumps(loader)) is not None
    twin = _loop(_loader(shuffle), 40, fresh=True, val=_loader(False), watched=False)[1]
    assert losses == twin  # the training is unchanged


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_loop_through_its_loader_stays_quiet(shuffle):
    run, _ = _loop(_loader(shuffle), 80, fresh=False, val=_loader(False))  # 5 epochs
    assert_no_errors(run)
    assert [e for e in run.events if e.signal == "input_reiter"] == []
    assert np.nanmax(run.trace.scalar("in_reiter")) == 0  # seen, at every epoch's start


def test_a_raising_loop_restores_the_loader_class():
    loader = _loader(True)
    model = _mlp()
    with pytest.raises(RuntimeError, match="boom"), ndbg.watch(model, report=False):
        for _ in range(3):
            x, _ = next(iter(loader))
            model(x).sum().backward()
        raise RuntimeError("boom")
    assert DataLoader.__iter__ is loaders._ORIGINAL


# -- a heavy-tailed batch -----------------------------------------------------------------
def test_a_layer_that_carries_a_heavy_tailed_batch_is_not_its_own_regime_shift():
    """Log-normal features (sigma 2.5), clipped to their usual range except at step 45,
    whose batch holds an extreme sample 160x the usual abs-max: the first Linear's output
    moves with it. The input's jump is the event; the layer's is folded into it."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(80 * 32, 10, generator=g)
    y = x[:, :3].argmax(1)
    x = x.clamp(-2.5, 2.5)
    x[45 * 32 + 7] *= 160
    run, _ = watched_sgd(_mlp(), x, y, 80, 0.01, sample_every=1)
    first = run.trace.layers[0].name
    shifts = [e for e in run.events if e.kind == "regime_shift" and e.signal == "activation"
              and e.layer == first]
    assert shifts == [], shifts
    data = [e for e in run.events if e.signal == "input_scale"]
    assert [e.step for e in data] == [45], run.events
    assert run.first_failure is None or run.first_failure.signal == "input_scale"
