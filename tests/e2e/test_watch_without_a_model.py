"""`watch()` without a model: it finds the modules that train, the same failure as with the
model given, and leaves out a teacher run without gradients."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from loops import STEPS, S, scale_weight_at
from models import mlp, train
from torch import nn

import neuraldbg_nb as ndbg


def test_watch_without_a_model_finds_the_same_failure():
    def faulty_run(with_model: bool):
        setup = mlp()
        # overhead=None: statistics every 10 steps, not by wall time, so the two runs
        # record the same trace and can be compared event by event
        kw = {"report": False, "overhead": None}
        w = ndbg.watch(setup.model, **kw) if with_model else ndbg.watch(**kw)
        with w as run:
            train(setup, STEPS, on_step_start=scale_weight_at(setup.model, "2", S))
        return run

    given, found = faulty_run(True), faulty_run(False)
    assert found.trace.n_steps == STEPS
    assert found.trace.layer_names == given.trace.layer_names
    assert np.isfinite(found.trace.scalar("in_absmax")).all()
    ff = found.first_failure
    assert (ff.step, ff.layer, ff.kind) == (S, "2", "regime_shift"), ff.message
    assert [(e.step, e.layer, e.kind) for e in found.events] == \
           [(e.step, e.layer, e.kind) for e in given.events]


def test_watch_without_a_model_leaves_out_a_teacher_run_without_gradients():
    """Distillation: a frozen teacher called under no_grad trains nothing, so `watch()`
    without a model finds the student alone, and its fault where it is."""
    setup = mlp()
    torch.manual_seed(1)
    teacher = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 4))

    def distil(logits, y):
        with torch.no_grad():
            soft = teacher(setup.batch(len(seen))[0]).softmax(1)
        seen.append(1)
        return F.cross_entropy(logits, y) + F.cross_entropy(logits, soft)

    seen: list[int] = []
    setup.loss_fn = distil
    with ndbg.watch(report=False) as run:
        train(setup, STEPS, on_step_start=scale_weight_at(setup.model, "2", S))
    assert run.trace.layer_names == ["0", "1", "2", "3", "4"], "the student alone"
    ff = run.first_failure
    assert (ff.step, ff.layer) == (S, "2"), ff.message
