"""The input-batch detector (`detect.data`) on hand-made traces: an input jump is a
warning unless the model feels it, a scale that drifts without a jump is a warning, and a
repeated batch is info from the first step (full-batch training) and a warning when a
loader gets stuck."""

from __future__ import annotations

import numpy as np
import pytest
from traces import N, build, live_scan, noisy, of, same

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect, first_failure


@pytest.mark.parametrize("chunk", [1, 7, 60])
def test_an_input_jump_the_model_does_not_feel_is_a_warning(chunk):
    # the input's abs-max jumps 160x at step 30 (a heavy-tailed feature's extreme value
    # under a BatchNorm) and nothing moves: a warning; at step 45 the same jump with the
    # first layer's output 100x (a Linear first): an error; at step 52, with a gradient
    # collapsing 1000x (a tanh RNN saturated, its output bounded): an error
    x = noisy(3e6)[:, 0]
    x[[30, 45, 52]] *= 160
    a = noisy(6.0, cols=2)
    a[45, 0] *= 100
    g = noisy(1e-2, cols=2)
    g[52, 1] *= 1e-3
    layers = [("bn", "other"), ("fc", "other")]
    cols = {"act_absmax": a, "grad_norm": g, "param_norm": np.ones((N, 2)),
            "update_ratio": noisy(1e-3, cols=2)}
    scalars = {"loss": noisy(0.5, seed=3)[:, 0], "in_absmax": x}
    _, events = detect(build(layers, cols, scalars))
    found = [(e.step, e.severity) for e in of(events, "data_anomaly", signal="input_scale")]
    assert found == [(30, "warning"), (45, "error"), (52, "error")]
    _, det, _ = live_scan(layers, cols, scalars, chunk=chunk)
    assert [same(e) for e in det.events] == [same(e) for e in events]


@pytest.mark.parametrize("chunk", [1, 7, 400])
def test_an_input_scale_that_drifts_without_a_jump_is_a_warning(chunk):
    # 1.06x a step from step 100 (no step a jump): a warning once its level moved 100x over
    # 200 steps, and the first failure when a layer blows up later while it goes on; a
    # 1000x jump at step 100 is the jump's event, not also a drift; a steady input neither
    n = 400
    cols = {"grad_norm": noisy(1e-2, n=n), "param_norm": np.ones((n, 1)),
            "update_ratio": noisy(1e-3, n=n), "act_absmax": noisy(2.0, n=n)}
    cols["act_absmax"][300:] = np.inf  # the overflow it leads to
    found = {}
    for name, scale in (("drift", 1.06 ** np.clip(np.arange(n) - 100, 0, None)),
                        ("jump", np.where(np.arange(n) < 100, 1.0, 1000.0)),
                        ("steady", np.ones(n))):
        scalars = {"loss": noisy(1.0, n=n, seed=3)[:, 0],
                   "in_absmax": 3.0 * scale * noisy(1.0, n=n, seed=5)[:, 0]}
        _, events = detect(build([("fc", "other")], cols, scalars, n=n))
        found[name] = [(e.signal, e.step, e.severity) for e in of(events, "data_anomaly")]
        _, det, _ = live_scan([("fc", "other")], cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
        if name == "drift":
            root = first_failure(events, ndbg.Thresholds())
            assert (root.signal, root.step) == ("input_drift", found["drift"][0][1])
            assert "drifted" in root.message and "no step a jump" in root.message
    assert [(sig, sev) for sig, _, sev in found["drift"]] == [("input_drift", "warning")]
    # 100x from about step 190; judged from step 205, when a level 200 steps back exists
    assert found["drift"][0][1] == 205, found["drift"]
    assert found["jump"] == [("input_scale", 100, "warning")]  # (not felt: `data._felt`)
    assert found["steady"] == []


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_batch_repeated_from_the_first_step_is_info_and_a_stuck_loader_a_warning(chunk):
    cols = {"grad_norm": noisy(1e-2), "param_norm": np.ones((N, 1)),
            "update_ratio": noisy(1e-3)}
    every = np.ones(N)
    every[0] = 0.0                      # full-batch training: each batch is the last one
    stuck = np.zeros(N)
    stuck[30:] = 1.0                    # a loader stuck from step 30 on
    brief = np.zeros(N)
    brief[30:35] = 1.0                  # stuck for five steps, then fed again
    echo = np.ones(N)
    echo[::4] = 0.0                     # each batch used 4 times, from the first
    echo[40:46] = 1.0                   # ... and 10 times from step 36: at step 40 longer than ever
    found = {}
    for name, repeat in [("every", every), ("stuck", stuck), ("brief", brief), ("echo", echo)]:
        scalars = {"loss": np.ones(N), "in_repeat": repeat}
        _, events = detect(build([("a", "other")], cols, scalars))
        _, det, _ = live_scan([("a", "other")], cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
        found[name] = [(e.step, e.severity, e.end) for e in of(events, "data_anomaly")]
        if name == "every":
            assert "full-batch training" in of(events, "data_anomaly")[0].message
    assert found == {"every": [(1, "info", None)], "stuck": [(30, "warning", None)],
                     "brief": [(30, "warning", 35)], "echo": [(1, "info", 40), (40, "warning", None)]}
