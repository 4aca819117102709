"""Likely causes (`detect.causes`): a learning rate moved or rose into the failure without
stopping, or weights changed outside the optimizer, next to the first failure. Found on real short trainings, and said the same way
by every view: the story, the panel's state, and a run saved and loaded."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from models import mlp, train, weight_of

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect.causes import Cause, likely_causes
from neuraldbg_nb.detect.events import Event
from neuraldbg_nb.notebook import panel_state
from neuraldbg_nb.notebook.panel import Panel

S = 40
STEPS = 60


def lr_raised(factor: float):
    """The learning rate raised `factor`x from step S on, and left there."""
    def hit(step, model, opt):
        if step == S:
            for group in opt.param_groups:
                group["lr"] *= factor
    return {"on_step_start": hit}


def weights_scaled(layer: str, factor: float):
    """A layer's weights multiplied in place, outside the optimizer, at step S."""
    def hit(step, model, opt):
        if step == S:
            with torch.no_grad():
                weight_of(model, layer).mul_(factor)
    return {"on_step_start": hit}


def trained(fault=None, steps: int = STEPS, layer_hooks: str = "every") -> ndbg.Run:
    """Every step's activations are recorded (`layer_hooks="every"`), so that each
    failure's step is its own activation jump's, judged against every step before it."""
    setup = mlp()
    kw = {} if fault is None else fault(setup)
    with ndbg.watch(setup.model, report=False, layer_hooks=layer_hooks) as run:
        train(setup, steps, **kw)
    return run


def _said_everywhere(run: ndbg.Run, tmp_path) -> list[Cause]:
    """The run's likely causes, after checking that the story, the panel's state and the
    saved and loaded run say the same."""
    causes = run.likely_causes
    texts = [c.text for c in causes]
    story = str(run).splitlines()
    for text in texts:
        assert f"  {text}" in story, str(run)
    assert panel_state.panel_state(run, with_values=True)["likely_causes"] == texts
    assert Panel(run).likely_causes == texts
    loaded = ndbg.load(run.save(tmp_path / "run"))
    assert [_fields(c) for c in loaded.likely_causes] == [_fields(c) for c in causes]
    assert [line for line in str(loaded).splitlines() if "a likely cause" in line] == \
        [f"  {text}" for text in texts]
    return causes


def _fields(cause: Cause) -> tuple:
    """A cause's fields, NaN read as None (a cause known at its own step has no
    `previous`), so that two equal causes compare equal."""
    return tuple(None if isinstance(x, float) and math.isnan(x) else x
                 for x in vars(cause).values())


def test_a_learning_rate_raised_before_the_failure_is_its_likely_cause(tmp_path) -> None:
    """SGD at 0.05 raised 30x at step 40: a layer's activations jump at step 41, the
    first failure, and the learning rate's move the step before is said beside it."""
    run = trained(lambda setup: lr_raised(30))
    root = run.first_failure
    assert root is not None and root.step == S + 1, root
    causes = _said_everywhere(run, tmp_path)
    assert [(c.kind, c.step, c.layer) for c in causes] == [("lr_change", S, None)]
    cause = causes[0]
    assert math.isclose(cause.previous, 0.05) and math.isclose(cause.value, 1.5)
    assert cause.text == (f"the learning rate went 0.05 -> 1.5 at step {S}, 1 step before: "
                          f"a likely cause")


def test_a_learning_rate_raised_in_one_parameter_group_is_its_likely_cause() -> None:
    """A body and a head in two parameter groups at the same rate; only the head's is
    raised 100x at step 40: its updates explode at once, and the move, read on the
    largest of the groups' rates, is named as their likely cause."""
    def two_groups(setup):
        body = [p for m in list(setup.model)[:-1] for p in m.parameters()]
        setup.make_opt = lambda m: torch.optim.SGD(
            [{"params": body}, {"params": list(m)[-1].parameters()}], lr=0.05, momentum=0.9)

        def hit(step, model, opt):
            if step == S:
                opt.param_groups[1]["lr"] *= 100
        return {"on_step_start": hit}

    run = trained(two_groups)
    root = run.first_failure
    assert root is not None and (root.kind, root.layer, root.step) == (
        "exploding_update", "4", S), root
    causes = [(c.kind, c.step, c.value) for c in run.likely_causes]
    assert causes == [("lr_change", S, pytest.approx(5.0))], run.likely_causes


def test_with_sampled_layer_hooks_the_raised_learning_rate_is_still_named() -> None:
    """Under the default sampled hooks the step after the move is hooked (the learning
    rate moved 30x), and the recent level a jump is judged against is read from the
    hooked steps: the first failure comes within two steps and the move is named."""
    run = trained(lambda setup: lr_raised(30), layer_hooks="sampled")
    root = run.first_failure
    assert root is not None and root.step in (S + 1, S + 2), root
    assert not np.isnan(run.trace.col("act_absmax", S + 1, S + 2)).all()  # hooked
    assert [c.kind for c in run.likely_causes] == ["lr_change"]


def test_weights_multiplied_outside_the_optimizer_are_the_likely_cause(tmp_path) -> None:
    """A hidden layer's weights multiplied 1000x in place at step 40: its activations jump
    there (the first failure), and the edit, found before the step's forward, is said
    beside it with its size."""
    layer = mlp().layers["mid"]
    run = trained(lambda setup: weights_scaled(layer, 1000.0))
    root = run.first_failure
    assert root is not None and (root.layer, root.step) == (layer, S), root
    causes = _said_everywhere(run, tmp_path)
    assert [(c.kind, c.step, c.layer) for c in causes] == [("edited", S, layer)]
    edit = causes[0]
    assert 500 < edit.value < 2000, edit  # about 1000x the weights' size
    assert edit.text == (f"its weights were changed outside the optimizer "
                         f"({edit.value:.3g}x their size) before the forward of step {S}: "
                         f"a likely cause")


def test_a_weight_set_to_infinity_outside_the_optimizer_is_said_in_words(tmp_path) -> None:
    """One element of a hidden layer's weights set to inf in place at step 40: the edit is
    the likely cause beside the first failure at that layer and step, its size said in
    words (an infinite multiple of the weights' size is no number to print)."""
    layer = mlp().layers["mid"]

    def set_inf(setup):
        def hit(step, model, opt):
            if step == S:
                with torch.no_grad():
                    weight_of(model, layer).view(-1)[0] = math.inf
        return {"on_step_start": hit}

    run = trained(set_inf)
    root = run.first_failure
    assert root is not None and (root.layer, root.step) == (layer, S), root
    edits = [c for c in _said_everywhere(run, tmp_path) if c.kind == "edited"]
    assert [(c.step, c.layer) for c in edits] == [(S, layer)], run.likely_causes
    assert "(off all-zero weights or to non-finite values)" in edits[0].text
    assert "infx" not in str(run)


class _Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 32, batch_first=True)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0][:, -1])


def test_an_edit_the_first_failure_already_says_is_not_said_again() -> None:
    """An LSTM's recurrent weights multiplied 1000x in place at step 40, its gradients
    clipped: its output, a tanh's, cannot jump, nor can its gradient, so its update is
    the first failure, which says the weights were
    changed outside the optimizer with their size; no likely cause repeats it, measured
    another way (the edit check reads a slice of each weight)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = _Recurrent()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            if step == S:
                with torch.no_grad():
                    model.lstm.weight_hh_l0.mul_(1000.0)
            x = torch.randn(16, 10, 8, generator=gen)
            loss = torch.nn.functional.cross_entropy(model(x), (x[:, -1, 0] > 0).long())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    root = run.first_failure
    assert root is not None and (root.kind, root.layer, root.step) == (
        "exploding_update", "lstm", S), root
    assert "changed outside the optimizer" in root.message
    assert not [c for c in run.likely_causes if c.kind == "edited"], run.likely_causes


def test_a_healthy_run_has_no_likely_cause(tmp_path) -> None:
    run = trained()
    assert run.first_failure is None
    assert _said_everywhere(run, tmp_path) == []
    assert "a likely cause" not in str(run)


def test_a_learning_rate_moved_long_before_the_failure_is_not_its_cause() -> None:
    """A move more than `lookback` steps before the first failure is not named."""
    run = trained(lambda setup: lr_raised(30))
    root = run.first_failure
    assert root is not None and root.step == S + 1, root
    near = run.reclassify(lookback=1)
    assert near.first_failure == root
    assert [c.kind for c in near.likely_causes] == ["lr_change"]
    far = run.reclassify(lookback=0)  # its first failure is then the error at step 42
    assert far.first_failure is not None and far.first_failure.step > S
    assert far.likely_causes == []


@pytest.mark.parametrize("signal,value,previous,said", [
    ("collapse", 0.8, 4.0, ("its weights lost 80% of their size in one update, during step "
                            "41 (4 -> 0.8), as if zeroed or reset outside the optimizer")),
    ("update", 3.0, 2.0, None),  # the optimizer's own update was large: its own doing
])
def test_an_update_of_the_layer_next_to_it_is_a_cause_only_when_the_optimizer_did_not_make_it(
        signal, value, previous, said) -> None:
    root = Event(42, "fc", "regime_shift", "error", "fc: activations jumped", 900.0, 1.0,
                 "activation", order=1)
    update = Event(41, "fc", "exploding_update", "warning", "fc: weights changed", value,
                   previous, signal, order=1)
    causes = likely_causes([update, root], root, ndbg.Thresholds())
    assert [c.text for c in causes] == ([] if said is None else [f"{said}: a likely cause"])
    assert likely_causes([update, root], None, ndbg.Thresholds()) == []


# -- a learning rate that rises into the failure (`causes._lr_rising`) -------------------
def _root(kind: str, step: int) -> Event:
    return Event(step=step, layer="fc1", kind=kind, severity="error", message="", order=0)


def _lr_trace(lr: np.ndarray):
    from traces import build

    n = len(lr)
    return build([("fc1", "other")], {"grad_norm": np.full((n, 1), 0.1)}, {"lr": lr}, n=n)


@pytest.mark.parametrize("warmup", ["linear", "from_zero"])
def test_a_learning_rate_rising_into_the_failure_is_named_with_its_path(warmup) -> None:
    n = 80
    lr = 0.01 * (1 + np.arange(n)) if warmup == "linear" else 1e-3 * np.arange(n)
    causes = likely_causes([], _root("dead_units", 70), ndbg.Thresholds(), _lr_trace(lr))
    assert [c.kind for c in causes] == ["lr_rise"]
    c = causes[0]
    first = 0 if warmup == "linear" else 1  # the first positive value
    assert (c.step, c.value) == (first, pytest.approx(lr[70]))
    assert f"at step {first} -> " in c.text and "at step 70), and was still rising" in c.text
    assert "cap it" in c.text


@pytest.mark.parametrize("case", ["capped", "too_little", "falling", "data_root",
                                  "short_run"])
def test_a_learning_rate_that_stopped_rising_or_did_not_cause_it_is_not_named(case) -> None:
    n, step, kind = 80, 70, "dead_units"
    lr = 0.01 * (1 + np.arange(n))
    if case == "capped":  # the warm-up ended at step 30
        lr = np.minimum(lr, lr[30])
    elif case == "too_little":  # 2x in all
        lr = 0.01 * (1 + np.arange(n) / n)
    elif case == "falling":  # a decay
        lr = lr[::-1].copy()
    elif case == "data_root":
        kind = "data_anomaly"
    else:  # too few steps to speak of a rise
        step = 12
    th = ndbg.Thresholds()
    assert likely_causes([], _root(kind, step), th, _lr_trace(lr)) == []


def _warmup_run(cap: float | None) -> ndbg.Run:
    """SGD at 0.01 with momentum, under a warm-up `LambdaLR(opt, lambda s: 1 + s)`; `cap`:
    its factor at most (a warm-up that ends), None: it never ends (4.0 at step 400)."""
    setup = mlp()
    model = setup.model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 + s if cap is None else min(1.0 + s, cap))
    with ndbg.watch(model, report=False) as run:
        train(setup, 200, opt=opt, after_update=lambda step, m, o: sched.step())
    return run


def test_a_warm_up_that_never_ends_is_the_first_failure_where_updates_outgrow_weights(
        ) -> None:
    """The rate rises 0.01 more every step: the model learns, then the updates grow to
    a tenth of the weights and the loss turns up, some steps before units die. That step
    is the first failure, with the rate's path; nothing later is blamed on it twice."""
    run = _warmup_run(None)
    root = run.first_failure
    assert root is not None, str(run)
    assert (root.kind, root.signal) == ("lr_change", "rise"), str(run)
    assert root.layer in run.trace.layer_names
    others = [e.step for e in run.events if e.severity == "error" and e.kind != "lr_change"]
    assert others and root.step < min(others), str(run)
    assert root.previous == pytest.approx(0.01 * (1 + root.step), rel=1e-5)
    assert root.value >= 0.1  # a tenth of the weights in one update
    assert "rose" in root.message and "without stopping (0.01 at step 0 -> " in root.message
    assert f"the update of step {root.step} moved them by " in root.message
    assert "the loss turned up" in root.message and "Cap it" in root.message
    # the loss had fallen below its first level first: the model learned before the rise
    # outgrew it
    steps, loss = run.trace.history("loss")
    assert loss[steps <= root.step].min() < 0.5 * loss[0]
    assert not [c for c in run.likely_causes if c.kind == "lr_rise"]


def test_a_warm_up_that_ends_is_quiet() -> None:
    run = _warmup_run(5.0)
    assert run.first_failure is None, str(run)
    assert not [e for e in run.events if e.severity == "error"]
