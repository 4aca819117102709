"""The capture store: a budget that is never exceeded, events before references, and a
tensor kept under two names stored (and counted) once."""

from __future__ import annotations

import torch

from neuraldbg_nb.capture import EVENT, REFERENCE, CaptureStore

MB = 2**20


def _tensors(mb: float) -> dict[str, torch.Tensor | None]:
    return {"output": torch.ones(int(mb * MB) // 4), "input": None}


def test_budget_is_never_exceeded_and_events_push_out_references() -> None:
    store = CaptureStore(4 * MB)
    for step in range(4):
        assert store.add(step, "fc", REFERENCE, _tensors(1)) is not None
    assert store.add(4, "fc", REFERENCE, _tensors(1)) is None  # references only fill free room
    for step in range(10, 16):
        assert store.add(step, "fc", EVENT, _tensors(1)) is not None
        assert store.nbytes <= store.budget
    kept = [c.step for c in store]
    assert all(c.reason == EVENT for c in store), kept
    assert 10 in kept, "the earliest event capture is the last to go"
    assert store.nbytes == sum(c.nbytes for c in store)


def test_a_capture_larger_than_the_budget_is_dropped_and_counted() -> None:
    store = CaptureStore(MB)
    # each tensor alone is sampled down to a quarter of the budget; six of them do not fit
    big = {f"t{i}": torch.arange(MB, dtype=torch.float32) + i for i in range(6)}
    assert store.add(5, "fc", EVENT, big) is None
    assert store.dropped == 1 and store.nbytes == 0 and len(store) == 0


def test_a_tensor_under_two_names_is_copied_and_counted_once() -> None:
    grad = torch.randn(256, 256)
    store = CaptureStore(64 * MB)
    cap = store.add(7, "fc", EVENT, {"weight.grad": grad, "grad": grad})
    assert cap is not None
    assert cap["grad"] is cap["weight.grad"]
    assert cap["grad"].data_ptr() != grad.data_ptr() and torch.equal(cap["grad"], grad)
    assert cap.nbytes == store.nbytes == grad.numel() * 4
