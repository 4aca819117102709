"""The user's program behaves as unwatched: a watched model saves (`torch.save`), pickles
and deep-copies inside the watch, the copies carry no hooks and train as the original
would; `torch.compile` under a watch with no model gives no torch warning; layers called
through `layer.forward(x)` (forward-forward training) are said to be unseen instead of
being reported healthy; `torch.jit.trace`, `torch.jit.script` and `torch.export` inside
the watch make the model's own graph."""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.record import pickling


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def hooks(model: nn.Module) -> int:
    return sum(len(getattr(m, name)) for m in model.modules() for name in pickling.HOOK_DICTS)


def train(model: nn.Module, steps: int, on_step=None) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(steps):
        x = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if on_step is not None:
            on_step(step, model)
    return losses


@pytest.mark.parametrize("given", [True, False], ids=["model given", "no model"])
def test_save_pickle_and_deepcopy_inside_a_watch_work_and_carry_no_hooks(tmp_path, given):
    model = mlp()
    copies: dict[str, nn.Module] = {}

    def checkpoint(step, m):
        if step == 5:
            torch.save(m, tmp_path / "model.pt")
            torch.save(m.state_dict(), tmp_path / "state.pt")
            buf = io.BytesIO()
            torch.save(m, buf)
            copies["saved"] = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
            copies["pickled"] = pickle.loads(pickle.dumps(m))
            copies["deepcopy"] = copy.deepcopy(m)

    with ndbg.watch(model if given else None, report=False) as run:
        losses = train(model, 20, checkpoint)
    assert hooks(model) == 0 and run.trace.n_steps == 20
    assert pickling._own == set() and nn.Module.__getstate__ is pickling._module_getstate
    for name, c in copies.items():
        assert hooks(c) == 0, name
        assert all(torch.equal(a, b) for a, b in zip(c.state_dict().values(),
                                                    torch.load(tmp_path / "state.pt").values()))
    reloaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert hooks(reloaded) == 0
    # the watched training itself is unchanged
    assert all(torch.equal(a, b) for a, b in zip(losses, train(mlp(), 20)))


def test_a_copy_made_inside_a_watch_trains_unwatched_and_the_watch_ignores_it():
    model = mlp()
    with ndbg.watch(model, report=False) as run:
        train(model, 3)
        twin = copy.deepcopy(model)
        train(twin, 3)  # another model and optimizer: not this watch's steps
        train(model, 3)
    assert hooks(twin) == 0
    assert run.trace.n_steps == 6


def test_other_libraries_hooks_survive_pickling_and_copies():
    model = mlp()
    seen = []
    model[0].register_forward_hook(lambda m, a, o: seen.append(1))
    with ndbg.watch(model, report=False):
        train(model, 2)
        twin = copy.deepcopy(model)
    assert len(twin[0]._forward_hooks) == 1 and hooks(twin) == 1


def test_torch_compile_under_a_watch_with_no_model_gives_no_torch_warning():
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with ndbg.watch(report=False) as run:
            for _ in range(4):
                opt.zero_grad()
                compiled(torch.randn(8, 8)).sum().backward()
                opt.step()
        compiled(torch.randn(8, 8))  # outside the watch: the user's own filters again
    torch_warnings = [str(w.message) for w in said if "global hooks" in str(w.message)]
    assert torch_warnings == []
    assert run.trace.n_steps == 4


def forward_forward(layers: list[nn.Module], steps: int = 12) -> None:
    opts = [torch.optim.SGD(layer.parameters(), lr=0.01) for layer in layers]
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        for layer, opt in zip(layers, opts):
            y = torch.relu(layer.forward(x))  # the layer's own goodness: its own loss
            opt.zero_grad()
            y.square().mean().backward()
            opt.step()
            x = y.detach()


@pytest.mark.filterwarnings("ignore:.*torch.jit.trace.* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("given", [True, False], ids=["model given", "no model"])
def test_a_model_traced_inside_a_watch_traces_the_models_own_graph(given):
    """`torch.jit.trace` runs the model inside the watch, at sampled steps and others:
    the hooks do nothing while it traces, so the traced graph holds the model's own ops
    (the trace's own check of two runs passes, no TracerWarning), and the training's
    steps are watched as before."""
    x = torch.randn(4, 8)
    plain = [n.kind() for n in torch.jit.trace(mlp(), x).inlined_graph.nodes()]
    model = mlp()
    kinds = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        with ndbg.watch(model if given else None, report=False) as run:
            train(model, 12, on_step=lambda step, m: kinds.append(
                [n.kind() for n in torch.jit.trace(m, x).inlined_graph.nodes()]))
    assert kinds and all(k == plain for k in kinds), (kinds[0], plain)
    assert run.trace.n_steps == 12 and hooks(model) == 0


@pytest.mark.filterwarnings("ignore:.*torch.jit.* is deprecated:DeprecationWarning")
@pytest.mark.parametrize("given", [True, False], ids=["model given", "no model"])
def test_a_model_scripted_inside_a_watch_scripts_as_unwatched(given):
    """`torch.jit.script` of the watched model inside the watch compiles the model alone
    (the watch's hooks are Python it cannot compile; set aside meanwhile): the scripted
    module computes what the model does, with a hook of the program's own kept, and
    `torch.jit.script` is PyTorch's again after the block."""
    original = torch.jit.script
    x = torch.randn(4, 8)
    model = mlp()

    def doubled(m: nn.Module, args: tuple[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return y * 2

    model[2].register_forward_hook(doubled)  # the program's own, scriptable
    same = []

    def script(step, m):
        if step in (2, 3):
            scripted = torch.jit.script(m)
            with torch.no_grad():
                same.append(torch.equal(scripted(x), m(x)))

    with ndbg.watch(model if given else None, report=False) as run:
        train(model, 8, on_step=script)
    assert same == [True, True]
    assert run.trace.n_steps == 8 and torch.jit.script is original


def test_a_model_exported_inside_a_watch_exports_the_models_own_graph():
    """`torch.export.export` inside the watch: the watch's hooks do nothing while it
    traces, so the exported program holds the model's own ops, the watch goes on
    watching (no engine error), and no compiled training is said to go unwatched."""
    x = torch.randn(4, 8)

    def ops(program):
        return [n.target for n in program.graph.nodes if n.op == "call_function"]

    plain = ops(torch.export.export(mlp(), (x,)))
    model = mlp()
    exported = []
    with ndbg.watch(model, report=False) as run:
        train(model, 8, on_step=lambda step, m: exported.append(
            ops(torch.export.export(m, (x,)))) if step in (2, 3) else None)
    assert exported == [plain, plain]
    assert run.trace.n_steps == 8 and not run.notes, run.notes


def test_a_backward_wrapper_the_program_installs_inside_a_watch_stays_after_it():
    """A program that wraps `torch.autograd.backward` while watched (a profiler installed
    mid-run) keeps its wrapper after the block, and a later watch hears each backward
    once, through both wrappers."""
    original = torch.autograd.backward
    calls = []
    model = mlp()
    try:
        with ndbg.watch(model, report=False):
            prev = torch.autograd.backward

            def counting(*args, **kwargs):
                calls.append(1)
                return prev(*args, **kwargs)

            torch.autograd.backward = counting
            plain = train(model, 5)
        assert torch.autograd.backward is counting and len(calls) == 5
        with ndbg.watch(model, report=False) as run:
            again = train(model, 5)
        assert torch.autograd.backward is counting and len(calls) == 10
        assert run.trace.scalar("loss", 0, 5).tolist() == [float(x) for x in again]
    finally:
        torch.autograd.backward = original
    assert len(plain) == 5


def test_layers_called_through_forward_are_said_unseen_not_healthy():
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.Linear(16, 16)]
    with ndbg.watch(report=False) as run:
        forward_forward(layers)
    assert run.trace.n_layers == 0 and run.first_failure is None
    assert any("no layer of any model was seen" in n for n in run.notes)
    assert "watched no layer in" in str(run) and "no failure found" not in str(run)

    with ndbg.watch(layers, report=False) as run:
        forward_forward(layers)
    assert run.trace.n_layers == 2
    assert any("never ran through PyTorch's hooks" in n and "(0, 1)" in n for n in run.notes)


def test_a_healthy_model_called_as_usual_has_no_unseen_note():
    model = mlp()
    with ndbg.watch(model, report=False) as run:
        train(model, 12)
    assert not any("hooks" in n for n in run.notes)
