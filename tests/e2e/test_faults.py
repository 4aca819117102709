"""Faults injected at a known layer and step of a real (short) training: the first failure
must name that layer and that step.

Steps are 0-based optimizer steps: the forward/backward before the s-th `optimizer.step()`
belong to step s. Every fault is injected at step S=40, well after the regime-shift history
(window 20, warmup 5) exists.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from conftest import leftover_global_hooks, leftover_module_hooks
from models import FACTORIES, Setup, bias_of, train, weight_of

import neuraldbg_nb as ndbg

S = 40
STEPS = 60


# -- faults: each returns the keyword arguments of `train` that inject it at step S ------
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

# (architecture, fault, role of the faulty layer in Setup.layers or None, expected layer
#  role (None: the data), expected kind or None where several kinds are defensible)
CASES: list[tuple[str, Fault, str | None, str | None, str | None]] = [
    ("mlp", weight_x1000, "mid", "mid", "regime_shift"),
    ("mlp", bias_1e4, "mid", "mid", "regime_shift"),
    ("mlp", nan_weight, "mid", "mid", "nonfinite_activation"),
    ("mlp", nan_input, None, None, "data_anomaly"),
    ("mlp", input_x1e4, None, None, "data_anomaly"),
    ("mlp", lr_x1e4, None, "first", "exploding_update"),
    ("mlp", loss_inf, None, None, "loss_nonfinite"),
    ("cnn", weight_x1000, "mid", "mid", "regime_shift"),
    ("cnn", bias_1e4, "mid", "mid", "regime_shift"),   # conv bias before BatchNorm
    ("cnn", nan_weight, "mid", "mid", "nonfinite_activation"),
    ("cnn", zeroed, "norm", "norm", "regime_shift"),
    ("cnn", nan_input, None, None, "data_anomaly"),
    ("cnn", input_x1e4, None, None, "data_anomaly"),
    ("cnn", lr_x1e4, None, "first", "exploding_update"),
    ("rnn", weight_x1000, "head", "head", "regime_shift"),
    # LSTM outputs are bounded by tanh: its activations cannot jump 1000x, the layer still
    # has to be named (its weights blew up), whatever the kind.
    ("rnn", weight_x1000, "mid", "mid", None),
    ("rnn", bias_1e4, "head", "head", "regime_shift"),
    ("rnn", bias_1e4, "mid", "mid", None),
    ("rnn", nan_weight, "mid", "mid", "nonfinite_activation"),
    ("rnn", nan_input, None, None, "data_anomaly"),
    ("rnn", input_x1e4, None, None, "data_anomaly"),
    ("rnn", lr_x1e4, None, "first", "exploding_update"),
    ("transformer", weight_x1000, "mid", "mid", "regime_shift"),
    ("transformer", bias_1e4, "bias", "bias", "regime_shift"),
    ("transformer", nan_weight, "nan", "nan", "nonfinite_activation"),
    ("transformer", zeroed, "norm", "norm", "regime_shift"),
    ("transformer", lr_x1e4, None, "first", "exploding_update"),
    ("transformer", loss_inf, None, None, "loss_nonfinite"),
]


def _id(case) -> str:
    arch, fault, role, _, _ = case
    return f"{arch}-{fault.__name__}" + (f"-{role}" if role else "")


def run_with_fault(arch: str, fault: Fault, role: str | None, **watch_kw):
    setup = FACTORIES[arch]()
    layer = setup.layers[role] if role else None
    with ndbg.watch(setup.model, report=False, **watch_kw) as run:
        train(setup, STEPS, **fault(setup, layer))
    return setup, run


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_first_failure_is_the_injected_fault(case):
    arch, fault, role, expected_role, kind = case
    setup, run = run_with_fault(arch, fault, role)
    expected_layer = setup.layers[expected_role] if expected_role else None
    errors = [e for e in run.events if e.severity == "error"]
    assert errors, f"no error event at all; events: {[str(e) for e in run.events]}"
    early = [str(e) for e in errors if e.step < S]
    assert not early, f"error events before the fault at step {S}: {early}"
    ff = run.first_failure
    assert ff is not None
    got = (ff.step, ff.layer, ff.kind)
    assert ff.step == S, f"first failure {got}, expected step {S}: {ff.message}"
    assert ff.layer == expected_layer, (
        f"first failure {got}, expected layer {expected_layer!r}: {ff.message}")
    if kind is not None:
        assert ff.kind == kind, f"first failure {got}, expected kind {kind!r}: {ff.message}"
    assert ff.severity in ("warning", "error")
    assert run.trace.n_steps == STEPS
    assert run.status == "finished"


MESSAGE_CASES = [("mlp", weight_x1000, "mid"), ("mlp", nan_input, None),
                 ("mlp", input_x1e4, None), ("mlp", lr_x1e4, None)]


@pytest.mark.parametrize("arch,fault,role", MESSAGE_CASES,
                         ids=[f"{a}-{f.__name__}" for a, f, _ in MESSAGE_CASES])
def test_first_failure_message_is_a_sentence_with_the_numbers(arch, fault, role):
    _, run = run_with_fault(arch, fault, role)
    ff = run.first_failure
    assert ff is not None
    msg = ff.message
    assert f"step {S}" in msg, msg
    if ff.layer is not None:
        assert msg.startswith(ff.layer), msg
    assert msg[:1].isalnum(), f"message starts with {msg[:1]!r}: {msg!r}"
    if fault is nan_input:
        assert "non-finite" in msg or "nan" in msg.lower(), msg
    else:  # a measured change: the message gives its size
        assert any(ch.isdigit() for ch in msg.replace(f"step {S}", "")), msg
    assert "\n" not in msg
    # weights edited in place just before: the story says so beside the cause
    edited = "its weights were changed outside the optimizer" in str(run)
    assert edited == (fault is weight_x1000), str(run)


# -- stop_on="error" --------------------------------------------------------------------
def _assert_unhooked(model: torch.nn.Module) -> None:
    assert leftover_global_hooks() == []
    assert leftover_module_hooks(model) == []


def test_stop_on_error_raises_at_the_failure_step_before_the_update():
    setup = FACTORIES["mlp"]()
    layer = setup.layers["mid"]
    snapshot: dict[str, torch.Tensor] = {}

    def hit(step, model, opt):
        if step == S:
            with torch.no_grad():
                weight_of(model, layer).mul_(1000.0)
            snapshot.update({k: v.clone() for k, v in model.state_dict().items()})

    with pytest.raises(ndbg.TrainingFailure) as info, \
            ndbg.watch(setup.model, stop_on="error", report=False):
        train(setup, STEPS, on_step_start=hit)
    run = info.value.run
    assert isinstance(info.value, RuntimeError)
    assert run.status == "stopped"
    # raised from the optimizer pre-step hook of step S: the step is recorded ...
    assert run.trace.n_steps == S + 1
    assert run.first_failure is not None
    assert (run.first_failure.step, run.first_failure.layer) == (S, layer)
    assert f"step {S}" in str(info.value)
    # ... and the update of step S never happened: training stopped at the cause
    for k, v in setup.model.state_dict().items():
        assert torch.equal(v, snapshot[k]), f"{k} changed after the stop"
    assert ndbg.last_run() is run
    _assert_unhooked(setup.model)


def test_stop_on_error_for_a_bad_update_raises_one_step_later():
    """An update can only be judged after it happened: the exploding update of step S is
    seen at the next step boundary, so the trace has S+2 steps, the root is still step S."""
    setup = FACTORIES["mlp"]()
    with pytest.raises(ndbg.TrainingFailure) as info, \
            ndbg.watch(setup.model, stop_on="error", report=False):
        train(setup, STEPS, **lr_x1e4(setup, None))
    run = info.value.run
    assert run.trace.n_steps == S + 2
    ff = run.first_failure
    assert (ff.step, ff.layer, ff.kind) == (S, setup.layers["first"], "exploding_update")
    _assert_unhooked(setup.model)


def test_stop_on_error_for_bad_data():
    setup = FACTORIES["cnn"]()
    with pytest.raises(ndbg.TrainingFailure) as info, \
            ndbg.watch(setup.model, stop_on="error", report=False):
        train(setup, STEPS, **nan_input(setup, None))
    run = info.value.run
    assert run.trace.n_steps == S + 1
    ff = run.first_failure
    assert (ff.step, ff.layer, ff.kind) == (S, None, "data_anomaly")
    assert all(e.step == S for e in run.events if e.severity == "error")
    _assert_unhooked(setup.model)


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_a_loader_stuck_at_a_step_is_a_warning_there_and_full_batch_training_is_info(arch):
    setup = FACTORIES[arch]()
    fed = setup.batch
    setup.batch = lambda step: fed(min(step, S - 1))  # step S gets step S-1's batch again
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS)
    found = [(e.step, e.severity, e.signal) for e in run.events if e.kind == "data_anomaly"]
    assert found == [(S, "warning", "input_repeat")]

    setup = FACTORIES[arch]()
    fed = setup.batch
    setup.batch = lambda step: fed(0)  # full-batch training: one batch, every step
    with ndbg.watch(setup.model, report=False) as run:
        losses = train(setup, STEPS)
    assert losses[-1] < 0.5 * losses[0], "it fits its batch"
    found = [(e.step, e.severity, e.signal) for e in run.events if e.kind == "data_anomaly"]
    assert found == [(1, "info", "input_repeat")]
    assert not [str(e) for e in run.events if e.severity != "info"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_hot_batches_are_repeats_only_where_they_repeat(dtype):
    """Online training on one-hot inputs (batch size 1): every batch has the same min,
    max and sum, so only the weighted sum of the fingerprint tells them apart. With a
    strided sum (every third element) 172 of 299 steps read as repeats, where 13 were,
    and one of them was blamed as the run's first failure."""
    gen = torch.Generator().manual_seed(0)
    hot = torch.randint(0, 300, (120,), generator=gen)
    hot[50] = hot[49]  # one true repeat
    target = torch.randn(300, generator=gen)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ndbg.watch(model, report=False) as run:
        for i in hot.tolist():
            x = torch.nn.functional.one_hot(torch.tensor([i]), 300).to(dtype)
            loss = (model(x).float().squeeze() - target[i]) ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
    repeats = run.trace.scalar("in_repeat")
    true = [s for s in range(1, len(hot)) if hot[s] == hot[s - 1]]
    assert np.flatnonzero(repeats > 0).tolist() == true
    assert 50 in true


def test_batches_of_one_hot_states_are_told_apart():
    """A DQN-like loop: batches of 16 one-hot states out of 6. With weights 0, 1, 2, ...
    in the fingerprint, two batches whose hot positions added up alike were the same
    batch: 7 warnings "repeats the previous batch exactly" in 300 steps, none true."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    values = torch.randn(6, 3, generator=gen)
    states = torch.randint(0, 6, (300, 16), generator=gen)
    with ndbg.watch(model, report=False) as run:
        for s in states:
            x = torch.nn.functional.one_hot(s, 6).float()
            loss = torch.nn.functional.mse_loss(model(x), values[s])
            opt.zero_grad()
            loss.backward()
            opt.step()
    true = [t for t in range(1, len(states)) if torch.equal(states[t], states[t - 1])]
    assert np.flatnonzero(run.trace.scalar("in_repeat") > 0).tolist() == true == []
    assert [str(e) for e in run.events if e.kind == "data_anomaly"] == []


class _MaskHead(torch.nn.Module):
    """The logits of illegal actions set to -inf: a mask by design."""

    def forward(self, z: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
        return z.masked_fill(~legal, float("-inf"))


class _LogHead(torch.nn.Module):
    """log of probabilities: -inf where one underflows to 0 (the fault injected below)."""

    zero_at: int | None = None

    def forward(self, z: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(z, -1)
        if self.zero_at is not None:
            p = p * (torch.arange(p.shape[-1]) != self.zero_at)
        return torch.log(p)


@pytest.mark.parametrize("head", ["mask", "mask, NaN weight at S", "log, -inf at S"])
def test_minus_inf_is_a_mask_from_the_first_step_and_a_fault_later(head):
    """A layer whose output holds -inf from its first call (illegal actions' logits, a
    masked attention score) masks by design: no non-finite error at every step. A NaN in
    it is still one, and so is -inf in a layer whose output was finite before (a log
    of a probability that underflowed to 0), at its layer and step."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    last = _LogHead() if head.startswith("log") else _MaskHead()
    teacher = torch.randn(20, 10, generator=gen)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    model = torch.nn.ModuleDict({"net": net, "head": last})
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            x = torch.randn(128, 20, generator=gen)
            legal = torch.rand(128, 10, generator=gen) < 0.5
            legal[:, 0] = True
            if step == S and "NaN" in head:
                with torch.no_grad():
                    net[2].weight[0, 0] = math.nan
            if step == S and head.startswith("log"):
                last.zero_at = 3
            out = last(net(x), legal)
            target = (x @ teacher).masked_fill(~legal, float("-inf")).argmax(1)
            loss = torch.nn.functional.nll_loss(out, target) if head.startswith("log") else \
                torch.nn.functional.cross_entropy(out, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            last.zero_at = None
    ff = run.first_failure
    if head == "mask":
        assert ff is None and not [str(e) for e in run.events if e.severity == "error"]
        assert np.isfinite(run.trace.col("act_absmax")).all()
    elif "NaN" in head:
        assert (ff.step, ff.layer, ff.kind) == (S, "net.2", "nonfinite_activation"), ff
    else:
        assert (ff.step, ff.layer, ff.kind) == (S, "head", "nonfinite_activation"), ff


def test_stop_on_never_trains_through_a_nan():
    _, run = run_with_fault("cnn", nan_input, None)
    assert run.status == "finished"
    assert run.trace.n_steps == STEPS
    assert run.first_failure.step == S


def test_capture_at_the_first_failure_holds_the_blown_up_output():
    setup, run = run_with_fault("mlp", weight_x1000, "mid")
    cap = run.inspect(run.first_failure)
    assert cap.step == S and cap.layer == setup.layers["mid"]
    out = cap["output"]
    assert out.abs().max().item() > 500 * run.first_failure.previous
    assert torch.isfinite(out).all()


def test_units_dying_after_a_learning_rate_raised_tenfold_are_dated_when_they_began():
    """SGD with momentum, the learning rate raised 10x at step 100 (0.05 -> 0.5): the
    third layer's units die, 71% by the sampled step 110 (a warning), and cross the error
    line (90%) only at step 250. The first failure was dated step 250; it is the layer's
    dying from step 110, the first sample after the change."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    teacher = torch.randn(32, 8, generator=gen)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with ndbg.watch(model, report=False) as run:
        for step in range(300):
            x = torch.randn(128, 32, generator=gen)
            y = (x @ teacher + 0.5 * torch.randn(128, 8, generator=gen)).argmax(1)
            if step == 100:
                for group in opt.param_groups:
                    group["lr"] *= 10
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    ff = run.first_failure
    assert ff is not None and 100 <= ff.step <= 110, ff
    assert any(e.kind == "dead_units" and e.severity == "error" and e.step > 200
               for e in run.events)
    assert "the learning rate went 0.05 -> 0.5 at step 100" in str(run)  # named beside it


class _L2Norm(torch.nn.Module):
    """Rows scaled to unit length, the square root's derivative at 0 unguarded."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(d))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.scale * h / (torch.sqrt((h * h).sum(1, keepdim=True)) + 1e-6)


def test_a_gradient_made_non_finite_in_the_backward_is_the_cause_not_the_update():
    """One all-zero sample at step 40 (padding) through layers without bias: an L2 norm's
    square root meets 0, its backward makes NaN gradients for the layer before it, and
    the update carries them into the weights. The first failure was that update, "weights
    became non-finite during step 40 (learning rate 0.001)": the learning rate blamed.
    It is the layer's gradient, at that step."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64, bias=False), _L2Norm(64),
                                torch.nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    teacher = torch.randn(32, 10, generator=gen)
    with ndbg.watch(model, report=False) as run:
        for step in range(STEPS):
            x = torch.randn(64, 32, generator=gen)
            y = (x @ teacher).argmax(1)
            if step == S:
                x[5] = 0.0
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    ff = run.first_failure
    assert (ff.kind, ff.layer, ff.step) == ("nonfinite_gradient", "2", S), ff.message
    assert "learning rate" not in ff.message


def test_inputs_that_drift_a_little_every_step_are_the_first_failure():
    """Inputs scaled 1.06x more at every step from step 100 (an accumulating transform):
    no step is a jump, and what broke was a layer's gradient at step 235, blamed as the
    first failure. The drift is found once its level moved 100x (judged from step 205,
    200 steps after the first level), and the failure that follows is its symptom."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    teacher = torch.randn(32, 10, generator=gen)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ndbg.watch(model, report=False) as run:
        for step in range(240):
            x = torch.randn(64, 32, generator=gen)
            y = (x @ teacher).argmax(1)
            if step >= 100:
                x = x * 1.06 ** (step - 100)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    ff = run.first_failure
    assert ff is not None and (ff.kind, ff.signal, ff.step) == ("data_anomaly", "input_drift", 205)
    assert "drifted" in str(run).splitlines()[0]


def test_a_weight_decay_set_far_too_strong_is_the_weights_shrinking():
    """AdamW's weight decay set to 500 at step 40 (a typo for 5e-4): every update halves
    the weights, each below the exploding-update line (0.5x of their size), and nothing
    named the weights shrinking, only the activations collapsing after them."""
    setup = FACTORIES["mlp"]()
    opt = torch.optim.AdamW(setup.model.parameters(), lr=1e-3, weight_decay=0.01)

    def typo(step, model, opt):
        if step == S:
            for g in opt.param_groups:
                g["weight_decay"] = 500.0

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, opt=opt, on_step_start=typo)
    shrink = [e for e in run.events if e.signal == "shrink"]
    assert shrink and {e.severity for e in shrink} == {"warning"}
    assert all(S <= e.step <= S + 4 for e in shrink), [str(e) for e in shrink]
    assert setup.layers["mid"] in {e.layer for e in shrink}


@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_weights_zeroed_in_place_with_their_bias_kept_are_the_first_failure(arch):
    """A layer's weights zeroed between two steps, its bias kept (a bad checkpoint merge,
    a pruning bug): its output is the bias alone. The norm's fall in one update is below
    any growth line (a difference of norms reads at most 1x the weights' size), and the
    run had warnings and no first failure (the next layer's activations collapsing). A fall
    of 5x or more is an error and the layer's own change."""
    setup = FACTORIES[arch]()
    layer = setup.layers["mid"]

    def hit(step, model, opt):
        if step == S:
            with torch.no_grad():
                weight_of(model, layer).zero_()

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, on_step_start=hit)
    early = [str(e) for e in run.events if e.severity != "info" and e.step < S]
    assert not early, early
    ff = run.first_failure
    assert ff is not None and (ff.layer, ff.step) == (layer, S), str(run)
    if arch == "mlp":  # 4.38 -> 0.808; the next layer's activations collapsed 29x
        assert (ff.signal, ff.severity) == ("collapse", "error"), str(run)
        assert f"weights lost 82% of their size during step {S}" in ff.message
    else:  # behind a BatchNorm: a gradient that blows up, and an update 274x the weights
        assert ff.kind == "regime_shift", str(run)
