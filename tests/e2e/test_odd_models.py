"""Models off the beaten path: tuple, dict and None outputs, a model that trains inside its
forward, sparse outputs and inputs, attention and parametrized weights, integer inputs,
gradient checkpointing, frozen parameters and backbones, a data-parallel wrapper, and
`torch.func` transforms of the model. Each is watched as its layers are, and a fault
injected into it is found at its layer and step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import leftover_module_hooks
from loops import (
    STEPS,
    S,
    assert_no_errors,
    scale_weight_at,
    setup_loop,
    setup_with_model,
    task_batches,
    task_loop,
)
from models import measured, mlp, train, transformer
from torch import nn

import neuraldbg_nb as ndbg


class TupleBlock(nn.Module):
    """A layer with parameters that returns a tuple (like attention or an RNN)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 16) / 6 ** 0.5)
        self.bias = nn.Parameter(torch.zeros(16))

    def forward(self, x):
        h = x @ self.weight + self.bias
        return h, h.detach().mean()


class TupleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = TupleBlock()
        self.act = nn.ReLU()
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        h, aux = self.block(x)
        return self.head(self.act(h)), aux


class DictBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 16)

    def forward(self, x):
        return {"mask": x > 0, "hidden": self.fc(x)}  # first entry: not floating point


class DictModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = DictBlock()
        self.act = nn.Tanh()
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        out = self.block(x)
        return {"logits": self.head(self.act(out["hidden"])), "hidden": out["hidden"]}


class Recorder(nn.Module):
    """A leaf module used for a side effect only: it returns None."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def forward(self, x):
        self.seen += 1


class NoneModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.record = Recorder()
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x):
        h = self.fc1(x)
        self.record(h)
        return self.fc2(self.act(h))


ODD = {
    "tuple": (TupleModel, lambda o: o[0], "block"),
    "dict": (DictModel, lambda o: o["logits"], "block.fc"),
    "none-inside": (NoneModel, lambda o: o, "fc1"),
}


@pytest.mark.parametrize("kind", list(ODD))
def test_odd_outputs_are_watched(kind):
    make, logits, faulty = ODD[kind]
    torch.manual_seed(0)
    model = make()
    with ndbg.watch(model, report=False) as run:
        losses = task_loop(model, 40, out_to_logits=logits)
    assert torch.stack(losses)[-10:].mean() < torch.stack(losses)[:10].mean()
    assert run.trace.n_steps == 40
    assert_no_errors(run)
    names = run.trace.layer_names
    assert faulty in names, names
    a = measured(run)[:, names.index(faulty)]
    assert np.isfinite(a).all() and (a > 0).all(), f"{faulty} activations not measured"
    assert np.isfinite(run.trace.scalar("in_absmax")).all()
    assert leftover_module_hooks(model) == []


@pytest.mark.parametrize("kind", list(ODD))
def test_odd_outputs_fault_is_found(kind):
    make, logits, faulty = ODD[kind]
    torch.manual_seed(0)
    model = make()
    target = faulty
    with ndbg.watch(model, report=False) as run:
        task_loop(model, STEPS, out_to_logits=logits,
              on_step_start=scale_weight_at(model, target, S))
    ff = run.first_failure
    assert ff is not None
    assert (ff.step, ff.layer) == (S, target), ff.message


def test_module_returning_none_is_harmless():
    torch.manual_seed(0)
    model = NoneModel()
    with ndbg.watch(model, report=False) as run:
        task_loop(model, 20)
    assert model.record.seen == 20
    names = run.trace.layer_names
    if "record" in names:  # a layer with nothing to measure: no numbers, no events
        assert np.isnan(run.trace.col("act_absmax")[:, names.index("record")]).all()
        assert not [e for e in run.events if e.layer == "record"]
    assert_no_errors(run)


class TrainsInside(nn.Module):
    """A model that runs its own backward and returns None: its last layer, a sigmoid,
    is not the model's output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> None:
        self.gate(self.fc(x)).square().mean().backward()


def test_a_model_returning_none_keeps_its_last_sigmoid_judged_for_saturation():
    model = TrainsInside()
    x, _ = task_batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ndbg.watch(model, report=False) as run:
        for step in range(5):
            opt.zero_grad()
            model(x[step])
            opt.step()
    assert [(i.name, i.role) for i in run.trace.layers] == [("fc", "other"),
                                                           ("gate", "bounded")]


class SparseOut(nn.Module):
    """A layer of its own parameters that returns a sparse (COO) tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 16) * 0.4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.to_dense() @ self.weight).to_sparse()


class SparseModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sparse = SparseOut()
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.sparse(x).to_dense())


@pytest.mark.parametrize("sample_every", [1, 10])
def test_sparse_outputs_and_inputs_are_read_through_their_stored_values(sample_every):
    """PyTorch's reductions do not run on sparse tensors, so a layer returning one, or a
    sparse batch, cannot be reduced as a dense one inside the user's forward. Their
    extremes are read from the stored values, and a fault in that layer is found there."""
    torch.manual_seed(0)
    model = SparseModel()
    seen: list[float] = []
    model.sparse.register_forward_hook(
        lambda m, a, y: seen.append(y.detach().to_dense().abs().max().item()))
    x, y = task_batches(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with ndbg.watch(model, report=False, sample_every=sample_every) as run:
        for step in range(STEPS):
            if step == S:
                with torch.no_grad():
                    model.sparse.weight.mul_(1000.0)
            opt.zero_grad()
            F.cross_entropy(model(x[step, :, :6].to_sparse()), y[step]).backward()
            opt.step()
    hooked = run.trace.scalar("hooked") == 1
    traced = measured(run)[:, run.trace.layer_names.index("sparse")]
    np.testing.assert_allclose(traced, np.array(seen)[hooked], rtol=1e-6)
    assert np.isfinite(run.trace.scalar("in_absmax")).all()
    ff = run.first_failure
    assert ff is not None and (ff.step, ff.layer) == (S, "sparse"), ff
    assert run.inspect(ff)["weight"].shape == (6, 16)


def test_attentions_output_projection_is_part_of_the_attention_layer():
    """`nn.MultiheadAttention` never calls its `out_proj`: it passes its weights to a
    functional call, so listed alone it would be a row without activations, numbered
    after every layer that runs. Its weights are the attention layer's, and a fault in
    them is found there."""
    setup = transformer()
    attention = "encoder.layers.0.self_attn"

    def corrupt(step, model, opt):
        if step == S:
            with torch.no_grad():
                model.get_submodule(attention).out_proj.weight.mul_(1000)

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, on_step_start=corrupt)
    names = run.trace.layer_names
    assert not [n for n in names if "out_proj" in n], names
    assert not np.isnan(run.trace.col("act_absmax")).all(axis=0).any(), "a row never ran"
    first = run.first_failure
    assert (first.step, first.layer) == (S, attention), first
    tensors = run.inspect(first).tensors
    assert "out_proj.weight" in tensors and "in_proj_weight" in tensors


def test_parametrized_weights_are_part_of_their_layer():
    """`spectral_norm` and `weight_norm` compute a layer's weight in modules of their own,
    called when the weight is read; listed as layers, their "output" would be the weight
    and a NaN put into a parametrized weight would be named after the parametrization.
    They are part of their layer: its gradient norm includes them, and the NaN is the
    layer's, found at its step."""
    from torch.nn.utils import parametrizations

    torch.manual_seed(0)
    model = nn.Sequential(parametrizations.spectral_norm(nn.Linear(6, 16)), nn.ReLU(),
                          parametrizations.weight_norm(nn.Linear(16, 2)))

    def corrupt(step, m, opt):
        if step == S:
            with torch.no_grad():
                m[0].parametrizations.weight.original[0, 0] = math.nan

    with ndbg.watch(model, report=False) as run:
        task_loop(model, STEPS, on_step_start=corrupt)
    assert run.trace.layer_names == ["0", "1", "2"]
    assert np.isfinite(run.trace.col("grad_norm")[:S][:, [0, 2]]).all()
    first = run.first_failure
    assert (first.step, first.layer) == (S, "0"), first
    assert "parametrizations.weight.original" in run.inspect(first).tensors


def test_integer_inputs_embeddings():
    setup = transformer()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 40)
    assert run.trace.n_steps == 40
    in_max = run.trace.scalar("in_absmax")
    expected = [setup.batch(s)[0].max().item() for s in range(40)]
    np.testing.assert_array_equal(in_max, expected)
    assert not [e for e in run.events if e.kind == "data_anomaly"]
    assert_no_errors(run)


def test_integer_inputs_embedding_fault_is_found():
    setup = transformer()
    with ndbg.watch(setup.model, report=False) as run:
        train(setup, STEPS, on_step_start=scale_weight_at(setup.model, "emb", S))
    ff = run.first_failure
    assert (ff.step, ff.layer, ff.kind) == (S, "emb", "regime_shift"), ff.message


class Checkpointed(nn.Module):
    """A block run through gradient checkpointing, then a head: the reentrant kind runs
    the block's first forward with gradients off, inside the model's call, and again in
    the backward."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Linear(6, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 2)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.utils.checkpoint.checkpoint(self.block, self.stem(x),
                                              use_reentrant=self.reentrant)
        return self.head(h)


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_keeps_forward_order_and_finds_the_fault(reentrant):
    model = Checkpointed(reentrant)

    def corrupt(step, m, opt):
        if step == S:
            with torch.no_grad():
                m.block[0].weight.mul_(1000)

    with ndbg.watch(model, report=False) as run:
        task_loop(model, STEPS, on_step_start=corrupt)
    assert run.trace.layer_names == ["stem", "block.0", "block.1", "block.2", "block.3",
                                     "head"]
    assert not np.isnan(measured(run)).any(), "the block is recorded"
    first = run.first_failure
    assert first is not None and (first.layer, first.step) == ("block.0", S), first


class FrozenBackbone(nn.Module):
    """Transfer learning: a frozen backbone run under no_grad inside the forward, then a
    head that trains."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            features = self.backbone(x)
        return self.head(features)


def test_a_frozen_backbone_run_under_no_grad_inside_the_forward_is_recorded():
    """What is left out is a model called with gradients off, not a layer: a backbone run
    under no_grad inside a forward that trains is part of the training step."""
    model = FrozenBackbone()

    def corrupt(step, m, opt):
        if step == S:
            with torch.no_grad():
                m.backbone[2].weight.mul_(1000)

    with ndbg.watch(model, report=False) as run:
        task_loop(model, STEPS, on_step_start=corrupt,
              opt=torch.optim.SGD(model.head.parameters(), lr=0.05))
    assert not np.isnan(measured(run)).any()
    assert run.notes == []
    first = run.first_failure
    assert first is not None and (first.layer, first.step) == ("backbone.2", S), first


def test_frozen_parameters_are_not_vanishing():
    setup = mlp()
    model = setup.model
    for p in model[0].parameters():
        p.requires_grad_(False)
    with ndbg.watch(model, report=False) as run:
        losses = setup_loop(setup, 120)
    assert losses[-10:].mean() < losses[:10].mean()
    assert_no_errors(run)
    assert not [e for e in run.events if e.layer == "0" and e.severity != "info"]
    names = run.trace.layer_names
    g = run.trace.col("grad_norm")[:, names.index("0")]
    assert np.isnan(g).all(), "a frozen layer has no gradient: not measured, not 0"
    assert np.isfinite(measured(run)[:, names.index("0")]).all()


def test_frozen_layer_fault_is_still_found():
    setup = mlp()
    for p in setup.model[0].parameters():
        p.requires_grad_(False)
    with ndbg.watch(setup.model, report=False) as run:
        setup_loop(setup, STEPS, on_step_start=scale_weight_at(setup.model, "0", S))
    ff = run.first_failure
    assert (ff.step, ff.layer) == (S, "0"), ff.message


def test_a_layer_frozen_in_mid_run_is_said():
    """`requires_grad_(False)` on a layer at step 30 (a bug, or progressive freezing): its
    gradient and weight columns go empty from there. An info event at that step names it;
    the training is otherwise healthy."""
    setup = mlp()
    mid = setup.layers["mid"]
    opt = setup.make_opt(setup.model)

    def freeze(step, model, opt):
        if step == 30:
            module = dict(model.named_modules())[mid]
            module.requires_grad_(False)

    with ndbg.watch(setup.model, report=False) as run:
        train(setup, 60, opt=opt, on_step_start=freeze)
    frozen = [e for e in run.events if e.signal == "frozen"]
    assert [(e.layer, e.step, e.severity) for e in frozen] == [(mid, 30, "info")], run.events
    assert_no_errors(run)


def test_a_data_parallel_model_is_watched_under_its_own_layer_names():
    """`nn.DataParallel` (on the CPU it calls the model as it is; the same unwrapping
    serves DistributedDataParallel, `tests/e2e/test_distributed.py`): the same losses as the
    plain model, layers named as in the model ("2", not "module.2"), and a weight blown
    up at a known step found at that layer and step."""
    plain = setup_loop(mlp(), S)  # the steps before the fault
    setup = mlp()
    wrapped = nn.DataParallel(setup.model)
    with ndbg.watch(wrapped, report=False) as run:
        losses = setup_loop(setup_with_model(setup, wrapped), STEPS,
                             on_step_start=scale_weight_at(setup.model, "2", S))
    assert torch.equal(losses[:S], plain[:S])
    assert [layer.name for layer in run.trace.layers] == ["0", "1", "2", "3", "4"]
    ff = run.first_failure
    assert (ff.layer, ff.step) == ("2", S), ff


def test_torch_func_transforms_of_the_model_are_left_out_not_a_crash():
    """Per-sample gradients (DP-SGD: `vmap(grad(functional_call(model)))`) and a Jacobian
    penalty (`torch.func.jacrev` of the model inside a normal training step): under the
    transforms the hooks see wrapped tensors, which cannot be read on the host. Those
    calls are left out and said so, the watch goes on; the plain forward of the same step
    is recorded, and a fault in it is still found."""
    from torch.func import functional_call, grad, jacrev, vmap

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 20, generator=gen), torch.randint(0, 2, (64,), generator=gen)

    def sample_loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))
    with ndbg.watch(model, report=False) as run:
        for _ in range(15):  # DP-SGD: the gradients are set by hand
            params = {k: v.detach() for k, v in model.named_parameters()}
            g = per_sample(params, x, y)
            for k, p in model.named_parameters():
                p.grad = g[k].mean(0)
            opt.step()
    assert run.status == "finished" and run.trace.n_steps == 15
    assert not any("stopped" in n for n in run.notes), run.notes
    assert any("torch.func" in n for n in run.notes), run.notes
    assert np.isfinite(run.trace.col("grad_norm")).all()

    with ndbg.watch(model, report=False) as run:
        for step in range(40):  # a Jacobian penalty beside the loss; a fault at step 30
            if step == 30:
                with torch.no_grad():
                    model[2].weight.mul_(1000.0)
            opt.zero_grad()
            jac = jacrev(lambda v: model(v[None])[0])(x[0])
            loss = F.cross_entropy(model(x), y) + 1e-3 * jac.pow(2).sum()
            loss.backward()
            opt.step()
    assert run.status == "finished" and not any("stopped" in n for n in run.notes)
    assert np.isfinite(measured(run)).all()
    ff = run.first_failure
    assert ff is not None and (ff.layer, ff.step) == ("2", 30), ff
