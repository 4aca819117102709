"""A warm-up that never ends (`lr_change`, signal `rise`) on hand-made traces: the
learning rate rising every step is an error at the first update of a tenth of the
weights after the loss turned up, with the rate's path; a warm-up that ends, updates that
stay small, a loss that keeps falling or has no scale (below 0), a rise too small to
count and one raise at once stay quiet; a live scan in chunks agrees."""

from __future__ import annotations

import numpy as np
import pytest
from traces import build, live_scan, noisy, of, same

from neuraldbg_nb.detect import detect, first_failure
from neuraldbg_nb.detect.thresholds import Thresholds

N = 80
LAYERS = [("fc1", "other", True, 2000), ("fc2", "other", True, 2000)]
TURN = 40
"""The step from which the loss rises 1.1x a step: its level (the median of 5 steps)
reaches 2x its lowest at step 51, which judges the update of step 50."""


def _cols(case: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    s = np.arange(N)
    lr = 0.01 * (1 + s)
    if case == "capped":  # the warm-up ends at step 30
        lr = np.minimum(lr, lr[30])
    elif case == "small_rise":  # 3x in all
        lr = 0.01 * (1 + s / 40)
    elif case == "one_jump":  # raised 100x at once: a move, not a rise
        lr = np.where(s < 45, 0.01, 1.0)
    loss = noisy(0.1, N, sigma=0.01)[:, 0] * np.where(s < TURN, 1.0, 1.1 ** (s - TURN))
    if case == "falling":
        loss = 2.0 * 0.97 ** s
    elif case == "negative_loss":  # rises toward 0 from below (an ELBO, a critic's loss)
        loss = -2.0 * 0.97 ** s
    # update sizes read every 5 steps: a tenth of the weights from step 50 on
    size = np.full((N, 2), np.nan)
    scale = {"small_updates": 0.01, "mid_updates": 0.3}.get(case, 1.0)
    size[::5] = 0.002 * (1 + s[::5, None]) * scale
    size[::5, 1] *= 0.7
    return ({"grad_norm": noisy(0.1, N, 2), "param_norm": np.full((N, 2), 5.0),
             "update_ratio": size}, {"loss": loss, "lr": lr})


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_a_rise_whose_updates_outgrow_the_weights_is_an_error_with_its_path(chunk) -> None:
    cols, scalars = _cols("never_ends")
    _, events = detect(build(LAYERS, cols, scalars, n=N))
    # fc1's updates reach a tenth of its weights at step 50, fc2's (0.7 as large) at step 75
    rose, later = of(events, "lr_change", signal="rise")
    assert (rose.step, rose.severity, rose.layer) == (50, "error", "fc1")
    assert (later.step, later.layer) == (75, "fc2")
    assert rose.value == pytest.approx(0.102)
    assert rose.message.startswith("fc1 (Linear): the learning rate rose 51x without "
                                   "stopping (0.01 at step 0 -> 0.26 at step 25 -> 0.51 at "
                                   "step 50)")
    assert "the update of step 50 moved them by 0.1 of their size" in rose.message
    assert first_failure(events, Thresholds()) is rose
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(e) for e in of(det.events, "lr_change", signal="rise")] == \
        [same(rose), same(later)]


@pytest.mark.parametrize("chunk", [1, 7, N])
def test_updates_under_a_tenth_with_the_loss_up_over_a_window_are_an_error(chunk) -> None:
    """Updates of 3-5% of the weights (Adam's against weights that grow): the rise is
    named once the loss's level over `window` steps is twice its best, at a learning rate
    1.25x the one it was best at or more: the first sampled update after, step 60."""
    cols, scalars = _cols("mid_updates")
    _, events = detect(build(LAYERS, cols, scalars, n=N))
    (rose,) = of(events, "lr_change", signal="rise")
    assert (rose.step, rose.severity, rose.layer) == (60, "error", "fc1")
    assert "and the loss turned up as it rose: its level over 20 steps is " in rose.message
    assert "the update of step 60 moved the weights by 0.037 of their size" in rose.message
    _, det, _ = live_scan(LAYERS, cols, scalars, chunk=chunk)
    assert [same(e) for e in of(det.events, "lr_change", signal="rise")] == [same(rose)]


@pytest.mark.parametrize("case", ["capped", "small_rise", "one_jump", "falling",
                                  "small_updates", "negative_loss"])
def test_a_rise_that_ends_is_small_or_does_no_harm_is_quiet(case) -> None:
    cols, scalars = _cols(case)
    _, events = detect(build(LAYERS, cols, scalars, n=N))
    assert not of(events, "lr_change", signal="rise"), events


def test_the_condition_ends_where_the_rate_stops_rising() -> None:
    cols, scalars = _cols("never_ends")
    scalars["lr"] = np.minimum(scalars["lr"], scalars["lr"][60])
    _, events = detect(build(LAYERS, cols, scalars, n=N))
    (rose,) = of(events, "lr_change", signal="rise")
    assert (rose.step, rose.layer) == (50, "fc1")
    assert rose.end is not None and 60 < rose.end <= 71
