"""An error in the engine's own code (a bug, a model it does not understand) never stops
the training it watches: the watch stops, says so, and keeps what it recorded; the
training goes on, unchanged. A bug is injected into one part of the engine from step 5
on, and the same training runs unwatched beside it."""

from __future__ import annotations

import math

import pytest
import torch
from models import mlp, train

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect.detection import Detection
from neuraldbg_nb.notebook.panel import Panel
from neuraldbg_nb.record import reductions
from neuraldbg_nb.record.slices import Slices

FAULT = 5


class InjectedBug(RuntimeError):
    pass


def _break(monkeypatch: pytest.MonkeyPatch, part: str) -> dict[str, bool]:
    """`reductions.<part>` (or `Slices.<part>`, for a dotted "Slices.<part>") raises while
    the returned switch is on: a bug injected into the engine, not into the training."""
    owner: object = reductions
    label = part
    if part.startswith("Slices."):
        owner, part = Slices, part.removeprefix("Slices.")
    real = getattr(owner, part)
    switch = {"on": False}

    def broken(*args, **kwargs):
        if switch["on"]:
            raise InjectedBug(f"injected bug in {label}")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, part, broken)
    return switch


def _module_hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
               + len(m._forward_hooks_with_kwargs) + len(m._forward_pre_hooks_with_kwargs)
               for m in model.modules())


@pytest.mark.parametrize("part, where, recorded", [
    ("min_max", "root_pre", FAULT),        # the input batch, before the forward
    ("min_max", "post", FAULT),            # a layer's hook, inside the forward
    ("grouped_norms", "opt_pre", FAULT),   # the step boundary, before the update
    ("Slices.kept_and_edit_totals", "opt_pre", FAULT),  # the weights' edits, before the update
    ("Slices.keep", "opt_post", FAULT + 1),       # the weight probe, after the update
])
def test_an_engine_error_stops_the_watch_not_the_training(
        monkeypatch: pytest.MonkeyPatch, part: str, where: str, recorded: int) -> None:
    monkeypatch.delenv("NEURALDBG_STRICT")
    plain = train(mlp(), 20)
    setup = mlp()
    switch = _break(monkeypatch, part)
    now = {"step": -1}

    def arm(step, model, opt):
        now["step"] = step
        if where not in ("post", "opt_post"):
            switch["on"] = step >= FAULT

    def arm_in_update(opt, args, kwargs):  # after the engine's own (global) pre-hook
        switch["on"] = now["step"] >= FAULT

    def arm_in_forward(module, args):  # the input batch is read by then: a layer meets it
        switch["on"] = now["step"] >= FAULT

    pre = setup.model[0].register_forward_pre_hook(arm_in_forward) if where == "post" else None
    try:
        stopped = f"neuraldbg stopped watching at step {recorded}"
        # every step's layer hooks: each part named runs at each step, the fault's too
        opt = setup.make_opt(setup.model)
        if where == "opt_post":
            opt.register_step_pre_hook(arm_in_update)
        with pytest.warns(RuntimeWarning, match=stopped), \
                ndbg.watch(setup.model, report=False, layer_hooks="every") as run:
            watched = train(setup, 20, opt=opt, on_step_start=arm)
    finally:
        if pre is not None:
            pre.remove()

    assert torch.equal(torch.stack(watched), torch.stack(plain)), "the training changed"
    assert run.trace.n_steps == recorded
    assert math.isfinite(run.trace.scalar("loss")[recorded - 1])
    (note,) = run.notes
    assert f"({where}: InjectedBug: injected bug in {part})" in note
    assert f"the {recorded} steps recorded before are kept" in note
    assert run.status == "finished" and _module_hooks(setup.model) == 0
    assert "neuraldbg stopped watching" in str(run)
    assert Panel(run).notes == [note], "the panel shows it under its header"


def test_strict_mode_raises_the_engines_error_and_still_removes_every_hook(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # NEURALDBG_STRICT=1 is the test suite's setting (conftest)
    setup = mlp()
    switch = _break(monkeypatch, "grouped_norms")

    def arm(step, model, opt):
        switch["on"] = step >= FAULT

    with pytest.raises(InjectedBug), ndbg.watch(setup.model, report=False) as run:
        train(setup, 20, on_step_start=arm)
    assert run.status == "raised" and _module_hooks(setup.model) == 0


def test_an_engine_error_at_the_end_of_the_block_still_prints_the_story(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The last scan fails when the block ends (a bug in detection): a watch that prints
    its story (a script's, `report=True`) still prints it, with the error's note."""
    monkeypatch.delenv("NEURALDBG_STRICT")
    setup = mlp()
    real = Detection.advance
    ending = {"on": False}

    def advance(self, trace):
        if ending["on"]:
            raise InjectedBug("injected bug at the end")
        return real(self, trace)

    monkeypatch.setattr(Detection, "advance", advance)
    with pytest.warns(RuntimeWarning, match="the end of the block"):  # noqa: PT031, SIM117
        with ndbg.watch(setup.model, report=True) as run:
            train(setup, 12)
            ending["on"] = True
    err = capsys.readouterr().err
    assert run.trace.n_steps == 12
    assert "neuraldbg stopped watching" in err and "injected bug at the end" in err
    assert str(run).strip() in err


def test_stop_on_error_still_stops_the_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """TrainingFailure is raised inside the optimizer's hook on purpose: the guard that
    keeps the engine's own errors out of the training lets it through."""
    monkeypatch.delenv("NEURALDBG_STRICT")
    setup = mlp()
    nan_batch = lambda step, x: x * math.nan if step == FAULT else x
    with pytest.raises(ndbg.TrainingFailure), \
            ndbg.watch(setup.model, stop_on="error", report=False) as run:
        train(setup, 20, on_batch=nan_batch)
    assert run.first_failure.step == FAULT and run.notes == []


def test_a_live_panel_shows_the_engines_error_while_the_training_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No step after the error pushes the panel, so the error pushes it itself: the
    note is under the panel's header while the cell still trains, not when it ends."""
    monkeypatch.delenv("NEURALDBG_STRICT")
    setup = mlp()
    switch = _break(monkeypatch, "grouped_norms")
    seen: dict[int, list[str]] = {}
    panel: list[Panel] = []

    def arm(step, model, opt):
        switch["on"] = step >= FAULT
        if panel:
            seen[step] = list(panel[0].notes)

    with ndbg.watch(setup.model, report=False) as run:
        panel.append(Panel(run))
        with pytest.warns(RuntimeWarning, match="neuraldbg stopped watching"):
            train(setup, 20, on_step_start=arm)
        assert run.status == "training"
    assert seen[FAULT] == [], "nothing to say before the error"
    assert seen[FAULT + 1] == run.notes and len(run.notes) == 1, \
        "the note is on the panel at the next step, while training"
