"""What the process keeps of ended runs: `ndbg.last_run()` and `ndbg.runs` hold runs, not
the models they watched, and `ndbg.runs` reads like a sequence."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
from models import mlp, train

import neuraldbg_nb as ndbg


def _spiked(step: int, x):
    return x * 50 if step == 23 else x


def test_the_last_run_keeps_its_numbers_but_not_its_model() -> None:
    """After the block, a model nothing else holds is freed with its memory (the run
    the process keeps as `last_run()` held it through its recorder); the run still says
    what it found and what its recorder did (a replay at the spiked step)."""
    setup = mlp()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 40, on_batch=_spiked)
    model = weakref.ref(setup.model)
    del setup
    gc.collect()
    assert model() is None
    last = ndbg.last_run()
    assert last is run and last.trace.n_steps == 40 and last.recorder.replays >= 1
    assert not math.isnan(float(last.trace.scalar("loss")[-1]))
    with pytest.raises(RuntimeError, match="inside the `with watch"):
        last.step()


def test_runs_iterate_over_the_runs_in_memory_and_index_like_a_sequence() -> None:
    kept = []
    for _ in range(2):
        setup = mlp()
        with ndbg.watch(setup.model, report=False) as run:
            train(setup, 3)
        kept.append(run)
    alive = list(ndbg.runs)
    assert alive[-2:] == kept and ndbg.runs[-1] is kept[-1]
    with pytest.raises(IndexError):
        ndbg.runs[len(ndbg.runs)]
