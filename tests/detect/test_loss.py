"""The loss detector (`detect.loss`) on hand-made traces: a risen loss is judged against
where it started, and a jump is not also a climb."""

from __future__ import annotations

import numpy as np
import pytest
from traces import build, live_scan, noisy, of, same

from neuraldbg_nb.detect import detect


@pytest.mark.parametrize("chunk", [1, 7, 300])
def test_a_risen_loss_is_an_error_near_where_it_started_and_a_jump_is_not_a_climb(chunk):
    # from 1.0 the loss falls to 1e-3 by step 100; at step 150 it jumps 40x (still 27x
    # below its first value: a warning) and hovers; a second run's jumps 400x (0.4: an
    # error) and is not also a climb over 200 steps; a third climbs 10x every 60 steps
    # from step 150 on (a warning, an error from a tenth of where it started)
    n = 400
    fall = np.concatenate([10 ** (-np.arange(100) / 33.3), np.full(n - 100, 1e-3)])
    runs = {"harder": fall.copy(), "diverged": fall.copy(), "climbs": fall.copy()}
    runs["harder"][150:] *= 40
    runs["diverged"][150:] *= 400
    runs["climbs"][150:] *= 10 ** (np.arange(n - 150) / 60)
    cols = {"grad_norm": noisy(1e-2, n=n), "param_norm": np.ones((n, 1)),
            "update_ratio": noisy(1e-3, n=n)}
    found = {}
    for name, loss in runs.items():
        scalars = {"loss": loss * noisy(1.0, n=n, seed=3)[:, 0]}
        _, events = detect(build([("a", "other")], cols, scalars, n=n))
        found[name] = [(e.signal, e.severity) for e in of(events, "loss_divergence")]
        _, det, _ = live_scan([("a", "other")], cols, scalars, chunk=chunk)
        assert [same(e) for e in det.events] == [same(e) for e in events]
        if name == "harder":
            assert events[0].message.endswith("; still 27x below its first value 1.11")
    assert found == {"harder": [("loss", "warning")], "diverged": [("loss", "error")],
                     "climbs": [("loss_trend", "warning"), ("loss_trend", "error")]}
