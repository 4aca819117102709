"""The engine's own time: measured per step, summarised, and held against a budget.

The bookkeeping is tested on given numbers; the measurement on real trainings whose cost
is far on one side of the budget (a deep stack of tiny layers, where the per-step work
takes more than the whole plain step, and a wide shallow net, where it takes a few
percent), so that the machine's noise cannot move them across it.
"""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.live.selfcost import CHECK_EVERY, WARMUP, WINDOW, SelfCost
from neuraldbg_nb.notebook import panel_state
from neuraldbg_nb.record import reductions
from neuraldbg_nb.record.sampler import Sampler, is_reference_step

pytestmark = pytest.mark.timed  # (budgets and latencies on the wall clock)


class _Feed:
    """Steps recorded into a SelfCost in order, as the probe records them."""

    def __init__(self, cost: SelfCost) -> None:
        self.cost, self.step = cost, 0

    def __call__(self, n: int, wall: float = 0.010, own: float = 0.002,
                 hooks: float = 0.001, sampled: float = 0.0005) -> None:
        """Record steps until `n` more are summarised (warm-up and reference steps,
        which are left out, pass by on the way)."""
        target = self.cost.recorded + n
        while self.cost.recorded < target:
            self.cost.record(self.step, wall, own, hooks, sampled)
            self.step += 1


def test_the_summary_leaves_out_warm_up_and_reference_steps():
    cost = SelfCost()
    for step in range(50):  # layer discovery and reference captures cost far more
        rare = step < WARMUP or is_reference_step(step)
        cost.record(step, 0.010, 0.9 if rare else 0.002, 0.001, 0.0005)
    o = cost.summary()
    assert o is not None and o.steps == 50 - WARMUP - 3  # 8, 16 and 32 are references
    assert o.own_ms == pytest.approx(2.0)
    assert o.step_ms == pytest.approx(8.0)  # the loop's step without the engine
    assert o.fraction == pytest.approx(0.25)
    assert o.hooks_ms == pytest.approx(1.0) and o.sampled_ms == pytest.approx(0.5)
    assert o.floor == pytest.approx(1.5 / 8.0)
    assert "2.00 ms a step, +25.0% on the loop's 8.0 ms (last 39 steps" in str(o)
    assert SelfCost().summary() is None


def test_the_step_time_is_a_median_so_a_pause_between_steps_does_not_count():
    cost = SelfCost()
    feed = _Feed(cost)
    feed(30)
    feed(1, wall=5.0)  # an evaluation pass between two steps
    o = cost.summary()
    assert o is not None and o.step_ms == pytest.approx(8.0)


def test_memory_is_a_fixed_window_of_recent_steps():
    cost = SelfCost()
    feed = _Feed(cost)
    feed(3 * WINDOW, own=0.004)
    feed(WINDOW)  # the last window only
    o = cost.summary()
    assert o is not None and o.steps == WINDOW and o.own_ms == pytest.approx(2.0)
    assert cost._rows.shape[0] == WINDOW


@pytest.mark.parametrize("activations", [True, False])
def test_the_budget_note_comes_once_where_the_per_step_work_alone_exceeds_it(activations):
    cost = SelfCost(budget=0.02)
    feed = _Feed(cost)
    feed(CHECK_EVERY - 1)
    assert cost.budget_note(activations) is None  # not judged before CHECK_EVERY steps
    feed(1)
    note = cost.budget_note(activations)
    assert note is not None and cost.note == note
    assert "overhead budget of 2.0% cannot be held" in note
    assert "18.8% of this loop's step (1.50 ms of 8.0 ms): layer hooks" in note
    assert "1.00 ms, and reading every gradient" in note and "0.50 ms." in note
    assert ("activations=False" in note) == activations
    feed(CHECK_EVERY)
    assert cost.budget_note(activations) is None  # said once


def test_no_note_within_the_budget_or_without_one():
    within = SelfCost(budget=0.5)
    _Feed(within)(CHECK_EVERY)
    assert within.budget_note(True) is None
    unset = SelfCost()
    _Feed(unset)(CHECK_EVERY, own=0.009)
    assert unset.budget_note(True) is None


def test_the_sampler_gives_the_full_statistics_what_the_per_step_checks_leave():
    """Statistics costing 10% of a 10 ms step, under a 2% budget: every 5th step holds it
    with the whole budget, every 20th where the per-step work already takes 1.9%."""
    free = Sampler(10, 0.02)
    free.next(0, True, spent=0.001, plain=0.010, floor=0.0)
    assert free.interval == 10
    tight = Sampler(10, 0.02)
    tight.next(0, True, spent=0.001, plain=0.010, floor=0.019)
    assert tight.interval == 20
    fixed = Sampler(10, None)  # no budget: a fixed schedule whatever the cost
    fixed.next(0, True, spent=1.0, plain=0.010, floor=0.5)
    assert fixed.interval == 10


def _train(model: nn.Module, steps: int, batch: int, width: int, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, width, generator=g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ndbg.watch(model, report=False, **kw) as run:
            for _ in range(steps):
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
    notes = [w for w in caught if "overhead budget" in str(w.message)]
    return run, notes


def _deep_and_tiny() -> nn.Module:
    """80 layers of 8 units: the plain step is a few hundred microseconds, less than
    the engine's per-step work for 80 layers."""
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(40) for m in (nn.Linear(8, 8), nn.Tanh())])


def test_a_budget_the_per_step_checks_cannot_hold_is_reported_with_the_numbers():
    steps = WARMUP + 2 * CHECK_EVERY
    run, notes = _train(_deep_and_tiny(), steps, batch=4, width=8, overhead=0.02)
    assert len(notes) == 1, [str(w.message) for w in notes]
    assert notes[0].category is RuntimeWarning
    o = run.overhead
    assert o is not None and o.floor > 0.02 and o.hooks_ms > 0
    assert [n for n in run.notes if "overhead budget of 2.0% cannot be held" in n]
    label, detail = panel_state.cost(run)  # the panel's header
    assert label.startswith("watching +") and "cannot be held" in detail
    assert panel_state.notes(run) == [], "the budget note is the cost's tooltip, not twice"
    text = str(run)
    assert "note: the overhead budget of 2.0% cannot be held" in text
    assert "neuraldbg's own time:" in text
    # the statistics got only what the checks left of the budget: sampled far less
    # often than every 10th step
    assert run.trace.scalar("sampled").sum() < steps / 10


def test_a_budget_within_reach_is_quiet_and_the_cost_is_reported():
    torch.manual_seed(0)
    wide = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))
    run, notes = _train(wide, WARMUP + 2 * CHECK_EVERY, batch=512, width=512, overhead=0.5)
    assert notes == []
    o = run.overhead
    assert o is not None and 0 < o.fraction < 0.5 and o.hooks_ms > 0
    assert o.steps == sum(not is_reference_step(s) for s in range(WARMUP, WARMUP + 2 * CHECK_EVERY))


def test_gradients_only_spends_nothing_in_layer_hooks_and_reclassify_keeps_the_cost():
    run, _ = _train(_deep_and_tiny(), WARMUP + CHECK_EVERY, batch=4, width=8,
                    activations=False)
    o = run.overhead
    assert o is not None and o.hooks_ms == 0 and o.own_ms > 0
    assert run.reclassify(jump=20.0).overhead == o
    assert ndbg.Run(run.trace, run.thresholds, run.captures).overhead is None  # not measured



def test_the_budget_note_does_not_stop_a_training_where_warnings_are_errors():
    torch.manual_seed(0)
    model = _deep_and_tiny()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    steps = WARMUP + 2 * CHECK_EVERY
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ndbg.watch(model, report=False, overhead=0.02) as run:
            for _ in range(steps):
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
    assert run.trace.n_steps == steps and run.status == "finished"
    assert [n for n in run.notes if "overhead budget" in n]


@pytest.mark.parametrize("device", [False, True])
def test_the_wait_for_an_accelerator_in_the_steps_transfer_is_not_the_engines(
        device, monkeypatch):
    """On an accelerator, the step's one transfer waits for the device work queued before
    it, mostly the training's own; that wait must not be reported as watching's cost. The
    CPU stands in for a device (`HOST_DEVICES` emptied, the code path an accelerator
    takes), and the wait is made long (30 ms) so that it shows whichever way it goes."""
    if device:
        monkeypatch.setattr(reductions, "HOST_DEVICES", frozenset())
    to_host = reductions.Scalars.to_host

    def waiting(self):
        time.sleep(0.03)
        return to_host(self)

    monkeypatch.setattr(reductions.Scalars, "to_host", waiting)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    run, _ = _train(model, WARMUP + 16, batch=4, width=8)
    o = run.overhead
    assert o is not None
    assert (o.own_ms > 30) == (not device), o
