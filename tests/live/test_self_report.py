"""The self-report (`run.overhead`, `print(run)`): silent during warm-up, then in line with
what watching is measured to cost, PyTorch's hook dispatch included."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch import nn

import neuraldbg_nb as nd
from neuraldbg_nb.live.selfcost import SETTLED, STEADY, WARMUP, SelfCost
from neuraldbg_nb.record import timing
from neuraldbg_nb.record.sampler import is_reference_step
from neuraldbg_nb.record.timing import dispatch_s


def _recorded_after(steps: int) -> int:
    return sum(s >= WARMUP and not is_reference_step(s) for s in range(steps))


def test_nothing_is_said_until_the_estimate_is_steady():
    cost = SelfCost()
    step = 0
    while _recorded_after(step + 1) < STEADY:
        cost.record(step, 0.0003, 0.0003 if step < WARMUP else 0.00003, 0.0, 0.0)
        step += 1
        assert cost.summary() is None, step  # a first step's +100% is never said
    cost.record(step, 0.0003, 0.00003, 0.0, 0.0)
    o = cost.summary()
    assert o is not None and o.steps == STEADY


def test_a_cost_that_has_not_settled_is_not_said_until_later():
    cost = SelfCost()
    step = 0
    while cost.recorded < SETTLED - 1:  # the share quadruples from one half to the other
        cost.record(step, 0.010, 0.001 if cost.recorded < STEADY else 0.004, 0.0, 0.0)
        step += 1
    assert cost.recorded >= STEADY and cost.summary() is None
    cost.record(step + 1, 0.010, 0.004, 0.0, 0.0)
    assert cost.recorded == SETTLED and cost.summary() is not None


def _deep(width: int = 32, depth: int = 12) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(8, width)]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 2))


def _steps(model, opt, n: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        x, y = torch.randn(8, 8, generator=g), torch.randint(0, 2, (8,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_a_short_run_says_nothing_in_print():
    torch.manual_seed(0)
    model = _deep()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with nd.watch(model, report=False) as run:
        _steps(model, opt, WARMUP + 8)
    assert run.overhead is None
    assert "own time" not in str(run)


def test_hook_dispatch_is_measured_without_the_programs_global_hooks_hearing_it(monkeypatch):
    """Measured once per process; while a global module hook of the program's is
    installed (a FLOP counter), it is not measured (the hook would hear its calls)."""
    monkeypatch.setattr(timing, "_dispatch", [])
    heard: list[int] = []
    h = nn.modules.module.register_module_forward_hook(lambda m, a, y: heard.append(1))
    try:
        assert dispatch_s() == timing.DISPATCH_GUESS and not timing._dispatch
    finally:
        h.remove()
    assert not heard
    assert 0.0 <= dispatch_s() < 1e-3  # a few microseconds, measured once
    assert dispatch_s() == dispatch_s() and len(timing._dispatch) == 1


@pytest.mark.timed
def test_the_self_report_agrees_with_the_measured_cost_within_a_factor():
    """Interleaved blocks of the same loop, plain and watched (the benchmarks' method),
    against what the watched run says it cost: within a factor of 3 (loose: a shared
    machine's noise, never a timing bound)."""
    torch.manual_seed(0)
    model = _deep()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    block = 40
    plain: list[float] = []
    watched: list[float] = []
    reported: list[float] = []
    _steps(model, opt, 10)
    for _ in range(4):
        t0 = time.perf_counter()
        _steps(model, opt, block)
        plain.append((time.perf_counter() - t0) / block)
        with nd.watch(model, report=False) as run:
            _steps(model, opt, 40)  # the warm-up and the first reference steps, not timed
            t0 = time.perf_counter()
            _steps(model, opt, block)
            watched.append((time.perf_counter() - t0) / block)
        assert run.overhead is not None
        reported.append(run.overhead.own_ms / 1e3)
    extra = statistics.median(watched) - statistics.median(plain)
    said = statistics.median(reported)
    assert extra > 0 and said > 0
    assert 1 / 3 <= said / extra <= 3, (said, extra, statistics.median(plain))


def test_the_engine_s_work_outside_the_step_boundary_is_counted(monkeypatch):
    """What the optimizer's hook does before the step boundary (the weight copy before a
    sampled update) and the model's post-call hook are the engine's time too: made to
    take 2 ms each, a step reads at least 4 ms of it."""
    from neuraldbg_nb.record.inputs import Inputs
    from neuraldbg_nb.record.weights import WeightProbe

    def slow(real):
        def run(*args, **kwargs):
            time.sleep(0.002)
            return real(*args, **kwargs)
        return run

    monkeypatch.setattr(WeightProbe, "keep_before", slow(WeightProbe.keep_before))
    monkeypatch.setattr(Inputs, "model_output", slow(Inputs.model_output))
    torch.manual_seed(0)
    model = _deep(depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with nd.watch(model, report=False, sample_every=1) as run:
        _steps(model, opt, 60)
    assert run.overhead is not None and run.overhead.own_ms >= 4.0, run.overhead


@pytest.mark.timed  # (the whole run's share beside the per-step one, both on the wall clock)
def test_the_whole_run_counts_its_start_its_end_and_every_step():
    """`Overhead.whole`: the engine's time over the whole run, its warm-up, reference
    steps, the block's end (made to take 50 ms: the final scan) and time spent outside
    the block for it (`Watch.charge`) included; over the watched time without it. The
    per-step figure leaves them out, so on a short run the whole is the larger one."""
    from neuraldbg_nb.live import watcher

    torch.manual_seed(0)
    model = _deep(depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    real_scan = watcher.Watch._scan

    def slow_scan(self):
        if self.run.status != "training":  # (the block's final scan)
            time.sleep(0.05)
        return real_scan(self)

    w = nd.watch(model, report=False)
    try:
        watcher.Watch._scan = slow_scan
        t0 = time.perf_counter()
        with w as run:
            _steps(model, opt, 40)
        took = time.perf_counter() - t0
    finally:
        watcher.Watch._scan = real_scan
    o = run.overhead
    assert o is not None and o.whole is not None and o.whole_s is not None
    assert o.whole_s >= 0.05 + o.own_ms * o.steps / 1e3  # the end, and the steps summarised
    assert o.whole_s < took
    assert o.whole == pytest.approx(o.whole_s / (took - o.whole_s), rel=0.05)
    assert o.whole > o.fraction
    assert "over the whole run, its start and end included" in str(o)
    w.charge(0.5)  # a cell's panel, made before the block
    assert run.overhead.whole_s == pytest.approx(o.whole_s + 0.5)


def test_a_finished_short_run_says_what_it_cost_though_it_had_not_settled():
    """While training, a cost whose halves disagree is not said before `SETTLED` steps;
    once the block is over it is, as it was."""
    cost = SelfCost()
    cost.entered(time.perf_counter() - 1.0)  # (a block begun a second ago)
    step = 0
    while cost.recorded < STEADY + 2:  # the share quadruples from one half to the other
        cost.record(step, 0.010, 0.001 if cost.recorded < STEADY // 2 else 0.004, 0.0, 0.0)
        step += 1
    assert cost.recorded < SETTLED and cost.summary() is None
    cost.left(0.0)
    o = cost.summary()
    assert o is not None and o.steps == STEADY + 2 and o.whole is not None
