"""The probe's parts: each layer's hook is the forward recorder's own method, with nothing
in between; a model found as it runs is recorded from its first call; a block with a
forward and a loss but no step becomes one step; an engine error stops every part."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from models import mlp, train

import neuraldbg_nb as ndbg
from neuraldbg_nb.record import reductions
from neuraldbg_nb.record.forward import Forward


def test_each_layer_hook_is_the_forward_recorders_method_with_nothing_between() -> None:
    """The layer hook is the hot path: PyTorch calls a partial of the bound, guarded
    `Forward.post` directly, one per layer, and the guard calls the method itself."""
    setup = mlp()
    w = ndbg.watch(setup.model, report=False)
    with w:
        forward = w._probe._forward
        for name, m in setup.model.named_modules():
            hooks = list(m._forward_hooks.values())
            if not name:  # the model itself: its root hook (the end of the model's call)
                assert not any(isinstance(h, functools.partial) for h in hooks)
                continue
            (hook,) = hooks
            assert isinstance(hook, functools.partial) and hook.args[0].module is m
            assert hook.func.__self__ is forward and hook.func.__func__ is Forward.post
    assert not any(m._forward_hooks for m in setup.model.modules())


def test_a_model_found_as_it_runs_is_recorded_from_its_first_call() -> None:
    setup = mlp()
    x0, _ = setup.batch(0)
    with ndbg.watch(report=False) as run:
        train(setup, 5)
    assert run.trace.layer_names == ["0", "1", "2", "3", "4"]
    assert run.trace.scalar("in_absmax")[0] == pytest.approx(x0.abs().max().item())
    assert np.isfinite(run.trace.col("act_absmax")[0]).all()
    assert np.isfinite(run.trace.col("grad_norm")[0, [0, 2, 4]]).all()


def test_a_block_that_only_logs_losses_is_one_step() -> None:
    """No backward, no step: what `log_loss` was given is still recorded, as one step."""
    setup = mlp()
    w = ndbg.watch(setup.model, report=False)
    with pytest.warns(UserWarning, match="run.step"):  # noqa: PT031, SIM117 - warned at exit
        with w as run:
            for step in range(3):
                x, y = setup.batch(step)
                with torch.no_grad():
                    run.log_loss(F.cross_entropy(setup.model(x), y))
    assert run.trace.n_steps == 1
    assert math.isfinite(run.trace.scalar("loss")[0])
    assert math.isnan(run.trace.scalar("grads_missing")[0])  # no backward, nothing missing


def test_an_engine_error_stops_every_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """The input batch's summary fails (a hook of the probe's): the forward recorder's
    layer hooks stop with it, and what every part held is dropped."""
    monkeypatch.delenv("NEURALDBG_STRICT")
    real = reductions.min_max
    on = {"now": False}

    def broken(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if on["now"]:
            raise RuntimeError("injected")
        return real(x)

    monkeypatch.setattr(reductions, "min_max", broken)
    setup = mlp()
    w = ndbg.watch(setup.model, report=False)

    def arm(step, model, opt):
        on["now"] = step >= 3

    with w as run:
        with pytest.warns(RuntimeWarning, match="stopped watching at step 3"):
            train(setup, 8, on_step_start=arm)
        probe = w._probe
        assert probe.failed and probe._forward.failed
        assert probe._forward.held == {} and probe._inputs._outs == []
    assert run.trace.n_steps == 3
