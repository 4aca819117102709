"""The trace (`trace.columns`): the first step's gradient norms and loss, which the
exploding-gradient line is scaled by, survive compaction and a save and load."""

from __future__ import annotations

import numpy as np
from traces import N, build, noisy

from neuraldbg_nb.trace import Trace


def test_the_first_steps_gradient_norms_and_loss_survive_compaction_and_files(tmp_path):
    g = noisy(3e3, cols=2)
    g[0] = [1.8e3, 600.0]
    loss = np.linspace(3.0, 0.1, N)
    loss[0] = np.nan  # the first finite loss is the run's first
    trace = build([("a", "other"), ("b", "other")], {"grad_norm": g}, {"loss": loss})
    trace.compact(40)
    assert list(trace.first_grad_norm) == [1.8e3, 600.0]
    assert trace.first_loss == loss[1]
    trace.save(tmp_path / "t.npz")
    assert list(Trace.load(tmp_path / "t.npz").first_grad_norm) == [1.8e3, 600.0]
    assert Trace.load(tmp_path / "t.npz").first_loss == loss[1]
    # a file without them: they are read from its first steps where those are still exact
    fresh = build([("a", "other"), ("b", "other")], {"grad_norm": g}, {"loss": loss})
    fresh.save(tmp_path / "old.npz")
    with np.load(tmp_path / "old.npz") as z:
        arrays = {k: z[k] for k in z.files if k not in ("first_grad_norm", "first_loss")}
    np.savez_compressed(tmp_path / "old.npz", **arrays)
    assert list(Trace.load(tmp_path / "old.npz").first_grad_norm) == [1.8e3, 600.0]
    assert Trace.load(tmp_path / "old.npz").first_loss == loss[1]
