"""Causal order inside a step (`rootcause`): an update that explodes because the same
step's gradient exploded, at a learning rate that did not move, is a gradient failure; a
learning rate that moved makes it the update's."""

from __future__ import annotations

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import Event, first_failure


def _events(lr_moved: bool) -> list[Event]:
    events = [
        Event(10, "fc1", "exploding_update", "error", "update", value=5.0, previous=0.01,
              signal="update", order=1),
        Event(10, "fc2", "exploding_gradient", "error", "gradient", value=4e5, order=2,
              signal="gradient"),
        Event(10, "fc1", "exploding_gradient", "error", "gradient", value=2e5, order=1,
              signal="gradient"),
    ]
    if lr_moved:
        events.append(Event(5, None, "lr_change", "info", "lr", value=1.0, previous=0.01,
                            signal="lr"))
    return events


def test_an_update_exploding_with_its_gradient_at_a_steady_learning_rate_is_the_gradient():
    first = first_failure(_events(lr_moved=False), ndbg.Thresholds())
    assert (first.kind, first.layer) == ("exploding_gradient", "fc2"), first


def test_an_update_exploding_after_the_learning_rate_moved_is_the_update():
    first = first_failure(_events(lr_moved=True), ndbg.Thresholds())
    assert (first.kind, first.layer) == ("exploding_update", "fc1"), first
