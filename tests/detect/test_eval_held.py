"""Training in eval mode held for `eval_steps` steps in a row (`detect.loop`) on hand-made
traces: the warning becomes an error, the first failure dated from the warning's step; a
step without a backward does not break the stretch, training mode does; a live scan in
chunks finds the same."""

from __future__ import annotations

import numpy as np
import pytest
from traces import build, live_scan, noisy, of, same

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect, first_failure

N = 120


@pytest.mark.parametrize("chunk", [1, 9, N])
def test_eval_mode_held_for_eval_steps_is_an_error_dated_from_its_start(chunk):
    n = np.zeros(N)
    n[10:20] = 2.0       # a short stretch: a warning that ends
    n[40:] = 2.0
    n[70] = np.nan       # a step without a backward inside the stretch
    w = np.full((N, 1), 5.0)
    cols = {"grad_norm": noisy(0.1, n=N), "param_norm": w, "update_ratio": w * np.nan}
    scalars = {"eval_layers": n, "loss": np.ones(N)}
    layers = [("fc", "other")]
    _, events = detect(build(layers, cols, scalars, n=N))
    modes = of(events, "eval_mode")
    assert [(e.step, e.severity) for e in modes] == [(10, "warning"), (40, "warning"),
                                                     (89, "error")], modes
    first = first_failure(events, ndbg.Thresholds())
    assert (first.kind, first.step) == ("eval_mode", 40), first
    assert "from step 40:" in modes[1].message
    assert "for 50 steps in a row by step 89:" in modes[-1].message, "not from step 89"
    _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]
