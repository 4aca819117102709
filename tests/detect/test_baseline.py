"""The trailing baselines (`detect.baseline`) and their cache between
re-classifications (the panel's sliders): a cached re-classification equals a fresh
`detect`, the cache is invalidated when the trace grows or is compacted and is bounded,
and jumps are the same in blocks of any size."""

from __future__ import annotations

import numpy as np
import pytest
from traces import build, key, rich_trace

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import Detection, baseline, detect
from neuraldbg_nb.detect.baseline import BaselineCache
from neuraldbg_nb.live.captures import CaptureStore


def _recorded(th=None):
    """A recorded run of the rich trace, as `load` gives it."""
    layers, cols, scalars = rich_trace()
    trace = build(layers, cols, scalars, n=len(scalars["loss"]))
    return ndbg.Run(trace, th or ndbg.Thresholds(), CaptureStore(0))


@pytest.mark.parametrize("first, then", [
    ({"jump": 5.0}, {"jump": 500.0}),  # the 300x activation jump no longer counts
    ({"jump": 50.0}, {"jump": 3.0, "jump_error": 1000.0}),  # ... is only a warning
    ({"jump": 5.0}, {"window": 8, "warmup": 3, "noise": 2.0}),  # other baselines
    ({"jump": 5.0}, {"jump": 0.5}),  # a factor <= 1 flags every step: not kept
])
def test_reclassify_after_a_cached_one_equals_a_fresh_detect(first, then):
    run = _recorded()
    warm = run.reclassify(**first)
    assert len(run._baselines) > 0, "the first reclassify should keep the baselines"
    assert [key(e) for e in warm.events] == [key(e) for e in detect(run.trace, warm.thresholds)[1]]
    again = warm.reclassify(**then)  # from the re-classified run: the same cache
    assert again._baselines is run._baselines
    fresh = detect(run.trace, again.thresholds)[1]  # no cache at all
    assert [key(e) for e in again.events] == [key(e) for e in fresh]
    assert [key(e) for e in again.events] != [key(e) for e in warm.events], \
        "the thresholds should change something, so the comparison means something"
    # and back: the cached entries still give the first answer
    back = again.reclassify(warm.thresholds)
    assert [key(e) for e in back.events] == [key(e) for e in warm.events]


def test_the_reclassify_cache_is_invalidated_when_the_trace_grows_or_is_compacted():
    layers, cols, scalars = rich_trace()
    n = len(scalars["loss"])
    trace = build(layers, cols, scalars, n=n - 20)  # the first n - 20 steps for now
    run = ndbg.Run(trace, ndbg.Thresholds(), CaptureStore(0))
    th = ndbg.Thresholds(jump=5.0)
    run.reclassify(th)
    version = trace.version
    rows = {len(j.judged) for j in run._baselines._entries.values()}
    assert rows == {n - 20}
    for s in range(n - 20, n):  # the run goes on, with a jump in layer 3 at step n - 10
        scale = 1e3 if s >= n - 10 else 1.0
        trace.append({c: np.asarray(v[s] * (scale if c == "act_absmax" else 1.0), np.float32)
                      for c, v in cols.items()}, {c: float(v[s]) for c, v in scalars.items()})
    assert trace.version > version
    grown = run.reclassify(th)
    assert [key(e) for e in grown.events] == [key(e) for e in detect(trace, th)[1]]
    assert any(e.step == n - 10 and e.kind == "regime_shift" for e in grown.events)
    assert {len(j.judged) for j in run._baselines._entries.values()} == {n}, "stale entries"
    # a step filled in late changes the numbers too
    version = trace.version
    trace.set_layer_values("grad_norm", n - 5, np.full(4, 1e4, np.float32))
    assert trace.version > version
    filled = run.reclassify(th)
    assert [key(e) for e in filled.events] == [key(e) for e in detect(trace, th)[1]]
    # compaction: only the exact tail is judged again
    trace.compact(40)
    compacted = run.reclassify(th)
    fresh = Detection(th, start=trace.full_from)
    fresh.advance(trace)
    assert [key(e) for e in compacted.detection.events if e.step >= 39] == \
        [key(e) for e in fresh.events if e.step >= 39]
    assert {len(j.judged) for j in run._baselines._entries.values()} == {n - 40}


def test_the_reclassify_cache_is_bounded():
    run = _recorded()
    for window in range(3, 3 + 3 * BaselineCache.MAX_ENTRIES):
        run.reclassify(window=window, warmup=2)
        assert len(run._baselines) <= BaselineCache.MAX_ENTRIES
    # an entry: 1 byte per layer-step, plus 24 bytes per cell that stands out of the noise
    cells = run.trace.n_steps * run.trace.n_layers
    for jumps in run._baselines._entries.values():
        assert jumps.judged.nbytes == cells and len(jumps.at) < cells / 10
        assert jumps.nbytes == cells + 24 * len(jumps.at)


def test_jumps_are_the_same_in_blocks_of_any_size(monkeypatch):
    layers, cols, scalars = rich_trace()
    trace = build(layers, cols, scalars, n=len(scalars["loss"]))
    whole = [key(e) for e in detect(trace, ndbg.Thresholds(jump=5.0))[1]]
    monkeypatch.setattr(baseline, "BLOCK_CELLS", 1)  # blocks of 8 * window rows
    for th in (ndbg.Thresholds(jump=5.0), ndbg.Thresholds(jump=5.0, window=3)):
        blocks = [key(e) for e in detect(trace, th)[1]]
        monkeypatch.setattr(baseline, "BLOCK_CELLS", 10 ** 9)
        assert blocks == [key(e) for e in detect(trace, th)[1]]
        monkeypatch.setattr(baseline, "BLOCK_CELLS", 1)
    assert [key(e) for e in detect(trace, ndbg.Thresholds(jump=5.0))[1]] == whole
