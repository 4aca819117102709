"""Gradients that grow by a steady factor per layer toward the input from the first step
(`detect.growth`), and the likely causes of an update that applied an exploding gradient
(`detect.causes`), on hand-made traces."""

from __future__ import annotations

import numpy as np
from traces import N, build, noisy

from neuraldbg_nb.detect import Thresholds, detect, first_failure, likely_causes
from neuraldbg_nb.detect.growth import growth

DEPTH = 10
LAYERS = [(f"h{i}", "other") for i in range(DEPTH)] + [("head", "other")]


def _trace(first_grads, *, explode_update_at=None):
    n = len(LAYERS)
    grad = noisy(0.5, cols=n, seed=1)
    grad[0] = first_grads
    ratio = noisy(1e-3, cols=n, seed=4)
    pnorm = np.ones((N, n))
    if explode_update_at is not None:
        ratio[explode_update_at, 0] = 1.6  # the first layer's weights moved 1.6x their size
        pnorm[explode_update_at:, 0] = 2.6
    cols = {"act_absmax": noisy(2.0, cols=n), "grad_norm": grad, "param_norm": pnorm,
            "update_ratio": ratio}
    scalars = {"loss": noisy(1.4, seed=2)[:, 0], "lr": np.full(N, 0.05),
               "in_absmax": noisy(3.0, seed=5)[:, 0]}
    return build(LAYERS, cols, scalars)


def _steady(factor: float) -> np.ndarray:
    hidden = 0.2 * factor ** np.arange(DEPTH)[::-1]  # the first layer the largest
    return np.append(hidden, 1.0)  # the head at the loss's own scale


def test_a_steady_growth_toward_the_input_is_measured():
    g = growth(_trace(_steady(1.6)))
    assert g is not None and abs(g.factor - 1.6) < 0.01
    assert (g.first, g.last) == ("h0 (Linear)", f"h{DEPTH - 1} (Linear)")


def test_flat_ragged_or_shallow_gradients_are_no_growth():
    assert growth(_trace(_steady(1.0))) is None
    ragged = _steady(1.6)
    ragged[:DEPTH:2] = ragged[DEPTH - 1]  # every other layer at the smallest: not steady
    assert growth(_trace(ragged)) is None
    assert growth(_trace(np.append(0.2 * 1.6 ** np.arange(3)[::-1],
                                   [np.nan] * (DEPTH - 3) + [1.0]))) is None


def test_an_update_that_applied_the_init_grown_gradient_is_explained_as_such():
    trace = _trace(_steady(1.6), explode_update_at=0)
    _, events = detect(trace)
    root = first_failure(events, Thresholds())
    assert (root.kind, root.layer, root.step) == ("exploding_update", "h0", 0), root
    causes = likely_causes(events, root, Thresholds(), trace)
    kinds = [c.kind for c in causes]
    assert kinds == ["gradient", "init"], causes
    assert "gradient of norm 13.7 at step 0, at a learning rate that did not move (0.05)" \
        in causes[0].text
    assert causes[1].text.startswith("gradients grow about 1.6x per layer toward the input "
                                     "from step 0 (0.2 at h9 (Linear) -> 13.7 at h0 (Linear))")
    assert "initialisation" in causes[1].text
    flat = _trace(_steady(1.0), explode_update_at=0)
    _, events = detect(flat)
    assert likely_causes(events, first_failure(events, Thresholds()), Thresholds(), flat) == []
