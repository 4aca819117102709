"""Recoveries that never contradict (`scan`'s recoveries, from each detector's codes): a
condition ends only into a healthy state. An exploding gradient that falls to exactly 0,
a vanished one that shoots above the explode line, and a dead layer whose output turns
non-finite are not "back to healthy"."""

from __future__ import annotations

import numpy as np
from traces import N, build, noisy, of

from neuraldbg_nb.detect import detect


def _recoveries(events, layer):
    return [e for e in of(events, "recovery", layer)]


def test_an_exploding_gradient_that_falls_to_exactly_0_is_not_back_to_healthy():
    g = noisy(0.1)
    g[20:30] = 5e4
    g[30:] = 0.0
    _, events = detect(build([("fc", "other")], {"grad_norm": g}))
    (boom,) = of(events, "exploding_gradient")
    assert boom.step == 20 and boom.end is None, boom
    assert not [e for e in _recoveries(events, "fc") if "(0)" in e.message], events
    control = g.copy()
    control[30:] = 0.1  # back to an ordinary norm: that is a recovery
    (ended,) = of(detect(build([("fc", "other")], {"grad_norm": control}))[1],
                  "exploding_gradient")
    assert ended.end is not None


def test_a_vanished_gradient_that_shoots_above_the_explode_line_is_not_back_to_healthy():
    g = noisy(0.1)
    g[10:30] = 1e-9
    g[30:] = 5e4
    _, events = detect(build([("fc", "other")], {"grad_norm": g}))
    (vanished,) = of(events, "vanishing_gradient")
    assert vanished.step == 10 and vanished.end is None, vanished
    assert of(events, "exploding_gradient")


def test_a_dead_layer_whose_output_turns_non_finite_is_not_alive_again():
    dead = np.full((N, 1), 0.2)
    dead[10:] = 0.95
    dead[30:] = 0.0   # a NaN output holds no zeros: its dead fraction reads 0
    act = noisy(2.0)
    act[30:] = np.inf
    nonfinite = np.zeros((N, 1))
    nonfinite[30:] = 64
    t = build([("relu", "relu")], {"dead_frac": dead, "act_absmax": act,
                                   "act_nonfinite": nonfinite})
    _, events = detect(t)
    (died,) = of(events, "dead_units")
    assert died.step == 10 and died.end is None, died
    assert not [e for e in _recoveries(events, "relu") if "alive" in e.message]
    assert of(events, "nonfinite_activation", "relu")
