"""Faults injected into a training of the shared models (`models.FACTORIES`) at step
S, well after the regime-shift history (window 20, warmup 5) exists: each returns the
keyword arguments of `models.train` that inject it. Steps are 0-based optimizer steps: the
forward and backward before the s-th `optimizer.step()` belong to step s."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from models import FACTORIES, Setup, bias_of, train, weight_of

import neuraldbg_nb as ndbg

S = 40
STEPS = 60


def weight_x1000(setup: Setup, layer: str) -> dict:
    def hit(step, model, opt):
        if step == S:
            with torch.no_grad():
                weight_of(model, layer).mul_(1000.0)
    return {"on_step_start": hit}


def bias_1e4(setup: Setup, layer: str) -> dict:
    def hit(step, model, opt):
        if step == S:
            with torch.no_grad():
                bias_of(model, layer).add_(1e4)
    return {"on_step_start": hit}


def nan_weight(setup: Setup, layer: str) -> dict:
    def hit(step, model, opt):
        if step == S:
            with torch.no_grad():
                weight_of(model, layer).view(-1)[0] = float("nan")
    return {"on_step_start": hit}


def zeroed(setup: Setup, layer: str) -> dict:
    """A normalisation layer's weight and bias zeroed (a bad checkpoint merge): it outputs
    exactly 0, which the log-scale baseline cannot see (`regime.zeroed`)."""
    def hit(step, model, opt):
        if step == S:
            with torch.no_grad():
                weight_of(model, layer).zero_()
                bias_of(model, layer).zero_()
    return {"on_step_start": hit}


def nan_input(setup: Setup, layer: str | None) -> dict:
    def hit(step, x):
        if step == S:
            x = x.clone()
            x.view(-1)[3] = float("nan")
        return x
    return {"on_batch": hit}


def input_x1e4(setup: Setup, layer: str | None) -> dict:
    return {"on_batch": lambda step, x: x * 1e4 if step == S else x}


def lr_x1e4(setup: Setup, layer: str | None) -> dict:
    """The learning rate is raised before optimizer.step() of step S (one bad step)."""
    def raise_lr(step, model, opt):
        if step == S:
            for g in opt.param_groups:
                g["lr"] *= 1e4

    def restore(step, model, opt):
        if step == S:
            for g in opt.param_groups:
                g["lr"] /= 1e4
    return {"before_update": raise_lr, "after_update": restore}


def loss_inf(setup: Setup, layer: str | None) -> dict:
    """A bug in the loss at step S (a log of a probability that underflowed to 0): the
    loss is infinite, the gradients and then the update non-finite, all in that step."""
    now = {"step": -1}
    real = setup.loss_fn

    def loss_fn(out, y):
        loss = real(out, y)
        return loss * math.inf if now["step"] == S else loss

    def hit(step, model, opt):
        now["step"] = step

    setup.loss_fn = loss_fn
    return {"on_step_start": hit}


Fault = Callable[[Setup, str | None], dict]


def run_with_fault(arch: str, fault: Fault, role: str | None, **watch_kw):
    setup = FACTORIES[arch]()
    layer = setup.layers[role] if role else None
    with ndbg.watch(setup.model, report=False, **watch_kw) as run:
        train(setup, STEPS, **fault(setup, layer))
    return setup, run
