"""At most one device-to-host transfer per step: the probe's promise on a GPU.

On the CPU the same code path (with `reductions.HOST_DEVICES` emptied, so that the probe
treats the CPU as an accelerator) is checked by counting what would sync on a GPU: scalar
reads (`.item()`, `float(t)`: aten._local_scalar_dense) must not happen in the probe at
all, and the step's numbers must reach the host in exactly one `Scalars.to_host` batch.
On a CUDA machine the real count is taken with `torch.cuda.set_sync_debug_mode`.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import neuraldbg_nb as ndbg
from neuraldbg_nb.record import reductions


class CountScalarReads(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def _model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.BatchNorm1d(32), nn.Linear(32, 32),
                         nn.Tanh(), nn.Linear(32, 4)).to(device)


def _train(model: nn.Module, steps: int, device: str) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(64, 16, generator=g).to(device)
        y = torch.randint(0, 4, (64,), generator=g).to(device)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test_one_host_transfer_per_step_and_no_scalar_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # the accelerator code path: the CPU is not treated as the host
    monkeypatch.setattr(reductions, "HOST_DEVICES", frozenset())
    calls = []
    original = reductions.Scalars.to_host

    def counted(self: reductions.Scalars):
        calls.append(len(self))
        return original(self)

    monkeypatch.setattr(reductions.Scalars, "to_host", counted)
    steps = 25  # includes sampled steps (rich statistics) and update-ratio steps
    with CountScalarReads() as plain:
        _train(_model("cpu"), steps, "cpu")  # the optimizer itself reads its step counters
    model = _model("cpu")
    with CountScalarReads() as mode, ndbg.watch(model, capture_mb=0, report=False) as run:
        _train(model, steps, "cpu")
    assert run.trace.n_steps == steps
    assert mode.reads == plain.reads, "the probe read device scalars on the host (GPU syncs)"
    # one batch per step, plus the exit flush of the last update's weight norms
    assert len(calls) == steps + 1
    assert all(n > 0 for n in calls[:-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_sync_count_per_step() -> None:
    model = _model("cuda")
    _train(model, 3, "cuda")  # warm up kernels and the caching allocator
    steps = 20
    with ndbg.watch(model, capture_mb=0, report=False) as run, \
            warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            _train(model, steps, "cuda")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in seen if "synchroniz" in str(w.message).lower()]
    assert run.trace.n_steps == steps
    assert len(syncs) <= steps, f"{len(syncs)} syncs in {steps} steps"


def test_host_shortcuts_record_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU the probe reads min and max at once to skip counting passes; the trace
    must be the one the accelerator path records, NaN step included."""
    def record() -> dict[str, object]:
        model = _model("cpu")
        with ndbg.watch(model, capture_mb=0, sample_every=2, report=False) as run:
            _train(model, 12, "cpu")
            with torch.no_grad():
                model[3].weight[0, 0] = float("nan")
            _train(model, 4, "cpu")
        t = run.trace
        layer_cols = ("act_absmax", "act_nonfinite", "act_mean", "zero_frac")
        return {c: t.col(c, 0, t.n_steps) for c in layer_cols} | {
            c: t.scalar(c, 0, t.n_steps) for c in ("in_nonfinite", "in_absmax", "loss")}

    host = record()
    monkeypatch.setattr(reductions, "HOST_DEVICES", frozenset())
    device = record()
    assert (host["act_nonfinite"] > 0).any()  # the NaN steps were sampled and counted
    for name, values in host.items():
        assert values.tobytes() == device[name].tobytes(), name
