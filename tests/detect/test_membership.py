"""Weights with gradients that no optimizer holds (`detect.membership`) on hand-made traces:
an error at the first step it shows, per layer, with no patience; a warning for a model no
optimizer trains; quiet where every layer is held."""

from __future__ import annotations

import numpy as np
from traces import N, build, noisy, of

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import detect, first_failure


def _layers():
    return [("a", "other"), ("b", "other"), ("c", "other")]


def test_a_layer_out_of_every_optimizer_is_an_error_from_its_first_step_and_the_first_failure():
    unheld = np.zeros((N, 3))
    unheld[17:, 1] = 1.0
    act = noisy(2.0, cols=3)
    act[40:, 2] *= 300  # a later symptom elsewhere
    t = build(_layers(), {"grad_unheld": unheld, "act_absmax": act})
    _, events = detect(t)
    (e,) = of(events, "not_in_optimizer")
    assert (e.layer, e.step, e.severity, e.end) == ("b", 17, "error", None)
    assert "no optimizer holds" in e.message and "from step 17" in e.message
    assert "add_param_group" in e.message
    assert first_failure(events, ndbg.Thresholds()) is e


def test_a_replaced_layer_says_so_and_one_added_back_recovers():
    unheld = np.zeros((N, 3))
    unheld[:30, 2] = 2.0
    t = build(_layers(), {"grad_unheld": unheld})
    _, events = detect(t)
    (e,) = of(events, "not_in_optimizer")
    assert (e.layer, e.step, e.end) == ("c", 0, 30)
    assert "replaced after the optimizer was built" in e.message
    assert any(r.kind == "recovery" and r.layer == "c" and r.step == 30 for r in events)


def test_a_model_no_optimizer_trains_is_a_warning_and_held_or_unmeasured_layers_are_quiet():
    unheld = np.zeros((N, 3))
    unheld[:, 0] = 3.0
    unheld[:, 1] = np.nan  # a layer without weights
    _, events = detect(build(_layers(), {"grad_unheld": unheld}))
    (e,) = of(events, "not_in_optimizer")
    assert (e.layer, e.step, e.severity) == ("a", 0, "warning")
    assert "requires_grad_(False)" in e.message
    assert first_failure(events, ndbg.Thresholds()) is None
    assert not of(detect(build(_layers(), {"grad_unheld": np.zeros((N, 3))}))[1],
                  "not_in_optimizer")


def _cut_trace(cut: np.ndarray, act: np.ndarray | None = None, sampled=None):
    act = noisy(1.0, cols=3) if act is None else act
    scalars = {"sampled": np.ones(N) if sampled is None else sampled}
    return build(_layers(), {"grad_cut": cut, "act_absmax": act}, scalars)


def test_a_layer_cut_off_from_the_loss_is_an_error_once_it_held_cut_steps_dated_from_its_start():
    """Held by an optimizer, trainable, run every forward, no gradient: an error after
    `cut_steps` (8) steps in a row, dated from the first, and the first failure. Fewer
    steps in a row (a head trained in turn) are nothing."""
    cut = np.zeros((N, 3))
    cut[:, 0] = 1.0          # the cut-off encoder
    cut[3:10, 1] = 2.0       # seven steps: a turn, not a cut
    _, events = detect(_cut_trace(cut))
    (e,) = of(events, "cut_off")
    assert (e.layer, e.step, e.severity) == ("a", 0, "error")
    assert "cut off from the loss" in e.message and ".detach()" in e.message
    assert first_failure(events, ndbg.Thresholds()) is e
    (turn,) = of(detect(_cut_trace(cut), ndbg.Thresholds(cut_steps=6))[1], "cut_off", "b")
    assert (turn.step, turn.end) == (3, 10)


def test_a_whole_model_cut_off_and_an_unused_output_say_which_case_it_is():
    cut = np.zeros((N, 3))
    cut[:, 0] = 2.0
    cut[:, 2] = 3.0
    _, events = detect(_cut_trace(cut))
    model, unused = sorted(of(events, "cut_off"), key=lambda e: e.layer)
    assert (model.layer, model.severity) == ("a", "error")
    assert "no layer of its model gets a gradient" in model.message
    assert (unused.layer, unused.severity) == ("c", "info")
    assert "output does not reach the loss" in unused.message


def test_a_layer_that_did_not_run_is_not_cut_off_and_unhooked_steps_hold():
    """No output measured for the layer at a step whose activations were measured: it did
    not run (a branch not taken), so its missing gradient is no cut. Steps with no
    activation measured at all (the layer hooks off) hold the verdict."""
    cut = np.zeros((N, 3))
    cut[:, 1] = 1.0
    act = noisy(1.0, cols=3)
    act[:, 1] = np.nan
    assert not of(detect(_cut_trace(cut, act))[1], "cut_off")
    cut = np.zeros((N, 3))
    cut[10:, 0] = 1.0
    act = noisy(1.0, cols=3)
    sampled = np.zeros(N)
    sampled[::10] = 1.0
    act[sampled == 0] = np.nan  # hooks on at sampled steps only
    (e,) = of(detect(_cut_trace(cut, act, sampled))[1], "cut_off")
    assert (e.layer, e.step) == ("a", 10)
