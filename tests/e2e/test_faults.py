"""Faults injected at a known layer and step of a real (short) training of every shared
architecture: the first failure names that layer and that step, in a sentence with the
numbers, and the capture taken there holds the blown-up output. The faults are in
`faults.py`; each failure class has its own trainings in `test_*_faults.py`."""

from __future__ import annotations

import pytest
import torch
from faults import (
    STEPS,
    Fault,
    S,
    bias_1e4,
    input_x1e4,
    loss_inf,
    lr_x1e4,
    nan_input,
    nan_weight,
    run_with_fault,
    weight_x1000,
    zeroed,
)

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


def test_capture_at_the_first_failure_holds_the_blown_up_output():
    setup, run = run_with_fault("mlp", weight_x1000, "mid")
    cap = run.inspect(run.first_failure)
    assert cap.step == S and cap.layer == setup.layers["mid"]
    out = cap["output"]
    assert out.abs().max().item() > 500 * run.first_failure.previous
    assert torch.isfinite(out).all()
