"""The capture store: a budget that is never exceeded, events before references, a
tensor kept under two names stored (and counted) once, exact copies; and what the probe
holds for it on the CPU during real trainings."""

from __future__ import annotations

import itertools

import pytest
import torch
from models import mlp, train
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.live.captures import OWN_PAGES, CaptureStore
from neuraldbg_nb.record import reductions
from neuraldbg_nb.report.captures import EVENT, REFERENCE, REFERENCE_BYTES

MB = 2**20


def _tensors(mb: float) -> dict[str, torch.Tensor | None]:
    return {"output": torch.ones(int(mb * MB) // 4), "input": None}


def test_budget_is_never_exceeded_and_events_push_out_references() -> None:
    each = REFERENCE_BYTES / MB  # a reference keeps at most this much of a tensor
    store = CaptureStore(4 * REFERENCE_BYTES)
    for step in range(4):
        assert store.add(step, "fc", REFERENCE, _tensors(each)) is not None
    assert store.add(4, "fc", REFERENCE, _tensors(each)) is None  # references only fill free room
    for step in range(10, 16):
        assert store.add(step, "fc", EVENT, _tensors(each)) is not None
        assert store.nbytes <= store.budget
    kept = [c.step for c in store]
    assert all(c.reason == EVENT for c in store), kept
    assert 10 in kept, "the earliest event capture is the last to go"
    assert store.nbytes == sum(c.nbytes for c in store)


def test_references_keep_a_strided_sample_of_large_tensors_and_events_keep_them_whole() -> None:
    weight = torch.randn(512, 512)
    small = torch.randn(64)
    store = CaptureStore(64 * MB)
    ref = store.add(8, "fc", REFERENCE, {"weight": weight, "bias": small})
    assert ref is not None and ref.sampled == {"weight"}
    assert ref["weight"].numel() * 4 <= REFERENCE_BYTES
    assert torch.equal(ref["weight"], weight.reshape(-1)[::weight.numel() * 4 // REFERENCE_BYTES])
    assert torch.equal(ref["bias"], small)
    event = store.add(9, "fc", EVENT, {"weight": weight})
    assert event is not None and not event.sampled and torch.equal(event["weight"], weight)
    conv = torch.randn(16, 32, 16, 16).contiguous(memory_format=torch.channels_last)
    ref = store.add(8, "conv", REFERENCE, {"output": conv})  # sampled in memory order
    assert ref is not None and ref.sampled == {"output"}
    stride = conv.numel() * 4 // REFERENCE_BYTES
    assert torch.equal(ref["output"], conv.permute(0, 2, 3, 1).reshape(-1)[::stride])


def test_events_go_last_in_first_out_and_the_first_failure_stays() -> None:
    store = CaptureStore(4 * MB)
    for layer in ("a", "b", "c", "d"):  # four layers fire at the first failure, in order
        store.add(5, layer, EVENT, _tensors(1))
    store.add(6, "x", EVENT, _tensors(1))  # full: step 5's last one goes, its first stays
    store.add(7, "x", EVENT, _tensors(1))  # the latest step (6) goes first
    assert sorted(store._items) == [(5, "a"), (5, "b"), (5, "c"), (7, "x")]
    two = {"output": torch.ones(MB // 4), "input": torch.zeros(MB // 4)}
    assert store.add(8, "x", EVENT, two) is not None
    assert sorted(store._items) == [(5, "a"), (5, "b"), (8, "x")]
    for step in range(9, 40):  # however many events come after it
        assert store.add(step, "y", EVENT, _tensors(1)) is not None
        assert store.nbytes <= store.budget
    assert (5, "a") in store._items


def test_a_capture_larger_than_the_budget_is_sampled_to_fit_beside_others() -> None:
    store = CaptureStore(MB)
    # six tensors of a quarter of the budget each: together sampled down to half of it
    big = {f"t{i}": torch.arange(MB, dtype=torch.float32) + i for i in range(6)}
    bias = torch.arange(16, dtype=torch.float32)
    cap = store.add(5, "fc", EVENT, {**big, "bias": bias})
    assert cap is not None and store.dropped == 0
    assert cap.sampled == set(big) and torch.equal(cap["bias"], bias)  # the small one whole
    assert store.nbytes <= MB // 2 + 64
    stride = int(cap["t3"][1] - cap["t3"][0])  # an even stride over the whole tensor
    assert stride > 1 and torch.equal(cap["t3"], big["t3"][::stride])
    assert store.add(6, "fc", EVENT, big) is not None and (5, "fc") in store._items


def test_a_tensor_under_two_names_is_copied_and_counted_once() -> None:
    grad = torch.randn(256, 256)
    store = CaptureStore(64 * MB)
    cap = store.add(7, "fc", EVENT, {"weight.grad": grad, "grad": grad})
    assert cap is not None
    assert cap["grad"] is cap["weight.grad"]
    assert cap["grad"].data_ptr() != grad.data_ptr() and torch.equal(cap["grad"], grad)
    assert cap.nbytes == store.nbytes == grad.numel() * 4


def test_what_two_layers_share_at_a_reference_step_is_copied_once_with_its_values() -> None:
    """One layer's output is the next one's input (the hook holds it detached, the next
    layer is called with the tensor itself): a reference step copies it once for both
    captures, and each holds the values the step ended with."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 3))
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, m in model.named_children():
        m.register_forward_hook(lambda m, a, out, name=name: seen.__setitem__(
            name, (a[0].detach().clone(), out.detach().clone())))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    with ndbg.watch(model, report=False) as run:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    caps = [run.captures.find(0, name) for name in ("0", "1", "2", "3", "4")]
    assert all(c is not None and c.step == 0 and c.reason == REFERENCE for c in caps)
    for name, cap in zip(("0", "1", "2", "3", "4"), caps):
        assert torch.equal(cap["input"], seen[name][0].reshape(cap["input"].shape))
        assert torch.equal(cap["output"], seen[name][1].reshape(cap["output"].shape))
    for before, after in itertools.pairwise(caps):
        assert after["input"] is before["output"]  # one copy, not two


def test_tensors_are_told_apart_by_their_memory_and_subclasses_by_the_object() -> None:
    class Wrapped(torch.Tensor):
        pass

    x = torch.randn(4, 3)
    store = CaptureStore(64 * MB)
    cap = store.add(0, "fc", REFERENCE, {"output": x.detach(), "input": x, "row": x[1:]})
    assert cap is not None and cap["input"] is cap["output"] and cap["row"] is not cap["input"]
    a, b = x.as_subclass(Wrapped), x.as_subclass(Wrapped)  # no memory to tell them by
    cap = store.add(1, "fc", REFERENCE, {"output": a, "input": b})
    assert cap is not None and cap["input"] is not cap["output"]
    assert torch.equal(cap["input"], x) and torch.equal(cap["output"], x)


# -- what the probe holds for capture (real trainings) --------------------------------------
def _wide_run(step_of_fault: int, kind: str, batch: int = 512):
    """A 3-layer MLP with 1 MB activations (batch 512 x 512; 32 KB at batch 16): a
    gradient blown up 1e6 x
    at layer '2' (kind 'grad': the forward looks normal) or its weights x1000 (kind
    'weight': the forward jumps) at one step that is neither sampled nor a reference."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, 64, generator=g), torch.randint(0, 4, (batch,), generator=g)
    step = 0
    model[2].weight.register_hook(
        lambda grad: grad * 1e6 if kind == "grad" and step == step_of_fault else grad)
    with ndbg.watch(model, report=False) as run:
        for step in range(step_of_fault + 3):
            if kind == "weight" and step == step_of_fault:
                with torch.no_grad():
                    model[2].weight.mul_(1000)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return run


def test_a_large_cpu_activation_is_held_where_its_layer_jumps():
    run = _wide_run(13, "weight")
    ff = run.first_failure
    assert (ff.step, ff.layer) == (13, "2")
    cap = run.inspect(ff)
    assert cap.step == 13 and cap["output"].shape == (512, 512) and cap["input"] is not None


@pytest.mark.parametrize("batch", [512, 16])
def test_a_cpu_activation_that_looked_normal_is_not_held(monkeypatch, batch):
    """A gradient event on a layer whose forward looked normal: on the CPU its input and
    output were not held through the backward (the allocator cost: fresh pages for 1 MB
    ones, 4% of a 100-layer MLP's step for its 64 KB ones), so the capture has the
    weights and gradients only, and asking for the output says why. The accelerator code
    path holds them."""
    run = _wide_run(13, "grad", batch)
    event = next(e for e in run.events if e.layer == "2" and e.kind == "exploding_gradient")
    assert event.step == 13
    cap = run.inspect(event)
    assert cap.step == 13 and cap["grad"].abs().max() > 0
    assert "output" not in cap.tensors
    with pytest.raises(KeyError, match="looked unusual"):
        cap["output"]

    monkeypatch.setattr(reductions, "HOST_DEVICES", frozenset())
    run = _wide_run(13, "grad", batch)
    event = next(e for e in run.events if e.layer == "2" and e.kind == "exploding_gradient")
    assert run.inspect(event)["output"].shape == (batch, 512)


def test_large_copies_are_exact_in_pages_of_their_own():
    big = torch.randn(OWN_PAGES // 2, 3)[:, 1]  # a strided view of a large tensor
    for t in (big, big.to(torch.bfloat16), big > 0, torch.arange(OWN_PAGES, dtype=torch.int64)):
        store = CaptureStore(64 * MB)
        kept = store.add(1, "fc", EVENT, {"output": t})["output"]
        assert kept.dtype == t.dtype and torch.equal(kept, t)
        assert kept.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


def test_units_that_die_are_captured_at_the_step_their_event_names() -> None:
    """Dead units are judged on sampled steps and reported `patience` steps later, when
    the layer's tensors of the step they died at are gone: the watch captures them at the
    sampled step where the fraction crossed the line, so the event opens on that step's
    own input and output (not the nearest capture: a later step's batch alone)."""
    setup = mlp()
    relu = "3"  # the ReLU after the hidden layer "2"

    def kill(step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if step == 45:  # three quarters of its units below zero for every input
            with torch.no_grad():
                model[2].bias[:24] -= 50.0

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 80, on_step_start=kill)
    (dead,) = [e for e in run.events if e.kind == "dead_units" and e.layer == relu]
    assert dead.step == 50, dead  # the first sampled step after the fault
    cap = run.inspect(dead)
    assert (cap.step, cap.layer) == (50, relu), (cap.step, cap.layer)
    assert (cap["output"][:, :24] == 0).all() and (cap["input"][:, :24] < -10).all()
