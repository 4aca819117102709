"""The replay of a step's forward (`record.replay`): each layer's output in the replay is
the training's own, bit for bit, and the training after it is as without it."""

from __future__ import annotations

import contextlib
import math
import random
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import neuraldbg_nb as nd
from neuraldbg_nb.record.replay import (
    RECENT,
    Recent,
    Replay,
    anomalous,
    grad_total,
    gradient_cut,
    output_seen,
    same_output,
)

REPLAYED = 5


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3),
                         nn.Linear(32, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 3))


def _train(replay_at: int | None, *, autocast: bool = False, micro: int = 1,
           steps: int = 8) -> dict:
    """A short training whose every layer output is kept (by a forward hook) for the step
    `replay_at`, and replayed in the optimizer's pre-hook there."""
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    own: set[int] = set()  # the test's hooks play the watch's own
    replay = Replay(own)
    kept: dict[str, list[torch.Tensor]] = {"train": [], "replay": []}
    where = {"now": None}

    def keep(module, args, out):
        if where["now"] is not None:
            kept[where["now"]].append(out.detach().clone())

    def record(module, args, kwargs):
        if not replay.active:
            replay.record(module, args, kwargs)

    def pre(o, args, kwargs):
        if where["now"] == "train":
            where["now"] = "replay"
            assert replay.run(lambda: None, lambda: None)
        where["now"] = None

    handles = [m.register_forward_hook(keep) for m in model]
    handles.append(model.register_forward_pre_hook(record, with_kwargs=True))
    own.update(h.id for h in handles)
    if replay_at is not None:
        handles.append(opt.register_step_pre_hook(pre))
    losses = []
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        replay.new_step()
        where["now"] = "train" if step == replay_at else None
        opt.zero_grad()
        for _ in range(micro):
            x, y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = nn.functional.cross_entropy(model(x), y) / micro
            loss.backward()
            losses.append(loss.item())
        opt.step()
    for h in handles:
        h.remove()
    return {"kept": kept, "losses": losses, "rng": torch.get_rng_state(),
            "bn": [b.clone() for b in model[1].buffers()],
            "weights": [p.detach().clone() for p in model.parameters()]}


@pytest.mark.parametrize("case", [{}, {"autocast": True}, {"micro": 3}],
                         ids=["dropout+batchnorm", "bf16-autocast", "accumulation"])
def test_replayed_outputs_are_the_training_outputs_bit_for_bit(case):
    run = _train(REPLAYED, **case)
    train, replayed = run["kept"]["train"], run["kept"]["replay"]
    assert len(train) == len(replayed) == 8 * case.get("micro", 1)
    for a, b in zip(train, replayed):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)
    if case.get("autocast"):
        assert train[0].dtype == torch.bfloat16  # the replay re-entered autocast


@pytest.mark.parametrize("case", [{}, {"autocast": True}, {"micro": 3}],
                         ids=["dropout+batchnorm", "bf16-autocast", "accumulation"])
def test_training_after_a_replay_is_bit_identical(case):
    plain, replayed = _train(None, **case), _train(REPLAYED, **case)
    assert plain["losses"] == replayed["losses"]
    assert torch.equal(plain["rng"], replayed["rng"])
    for a, b in zip(plain["bn"], replayed["bn"]):
        assert torch.equal(a, b)
    for a, b in zip(plain["weights"], replayed["weights"]):
        assert torch.equal(a, b)


def test_inputs_changed_in_place_refuse_the_replay():
    model = _model()
    replay = Replay()
    x = torch.randn(4, 12)
    replay.record(model, (x,), {})
    model(x)
    x.mul_(2)
    assert "in place" in (replay.refusal() or "")
    assert not replay.run(lambda: None, lambda: None)
    assert replay.refused is not None and replay.replays == 0


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
def test_a_model_with_forward_hooks_of_its_own_is_replayed_without_them():
    """The model's own forward hooks (a user's feature logger) would hear a replayed call
    as a second forward: the replay runs without them and puts them back in their order;
    a weight-norm reparametrisation's pre-hook is part of the forward and runs; a hook
    that changes the output makes the replay's output unlike the training's, and the
    replay is refused, naming where the hook is."""
    model = _model().eval()
    nn.utils.weight_norm(model[0])
    x = torch.randn(4, 12)
    calls: list[str] = []
    first = model[4].register_forward_hook(lambda m, a, y: calls.append("first"))
    second = model[4].register_forward_hook(lambda m, a, y: calls.append("second"))
    replay = Replay()
    replay.record(model, (x,), {})
    replay.output(model(x))
    calls.clear()
    assert replay.refusal() is None
    assert replay.run(lambda: None, lambda: None) and replay.replays == 1
    assert calls == []  # not heard again
    model(x)
    assert calls == ["first", "second"]  # back, in their order
    first.remove()
    second.remove()

    model[4].register_forward_hook(lambda m, a, y: y * 2)  # part of what the model computes
    replay = Replay()
    replay.record(model, (x,), {})
    replay.output(model(x))
    assert not replay.run(lambda: None, lambda: None) and replay.replays == 0
    assert "the forward hooks of its own (4's" in (replay.refused or "")


_FORWARDS: list[int] = []


class _Branches(nn.Module):
    """A trunk with a branch added detached (`used`), a head left unused beside the
    output (`unused`), a recurrent layer returning a tuple, and, where `noisy`, a shift by
    how often a forward ran, counted outside the model (a forward that runs another way
    each time)."""

    def __init__(self, noisy: bool = False) -> None:
        super().__init__()
        self.trunk = nn.Linear(12, 16)
        self.used = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.unused = nn.Linear(16, 4)
        self.head = nn.Linear(16, 3)
        self.noisy = noisy

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(x)
        h = self.norm(h + self.used(h).detach())  # (a shift alone would be normed away)
        h = h + self.gru(h.unsqueeze(1))[0].squeeze(1).detach()
        if self.noisy:
            _FORWARDS.append(1)
            h = h + len(_FORWARDS)
        return self.head(h), self.unused(h)


def test_a_replay_with_a_layers_output_replaced_tells_a_used_output_from_an_unused_one():
    """`reaches`: an output that enters the model's first output (detached or not, a GRU's
    tuple too) changes it when replaced; one beside it does not. It cannot be told where
    the forward runs another way each time, nor where the inputs changed in place; the
    training's state is left as it was (the replays are no anomaly replays)."""
    torch.manual_seed(0)
    model = _Branches()
    x = torch.randn(8, 12)
    replay = Replay()
    replay.record(model, (x,), {})
    replay.output(model(x))
    rng = torch.get_rng_state()
    assert replay.reaches([model.used, model.gru, model.unused, model.head]) == [
        True, True, False, True]
    assert torch.equal(rng, torch.get_rng_state()) and replay.replays == 0
    assert replay.refused is None

    noisy = _Branches(noisy=True)
    replay = Replay()
    replay.record(noisy, (x,), {})
    noisy(x)
    assert replay.reaches([noisy.used, noisy.unused]) == [None, None]
    x.mul_(2)
    assert replay.reaches([model.used]) == [None]
    assert replay.refused is None  # (said where an anomaly's replay is refused)


def test_anomalous_reads_non_finite_values_and_jumps():
    losses = np.array([0.5, 0.4, 0.6])
    totals = np.array([2.0, 3.0, 2.5])

    def went_wrong(loss=0.5, total=2.5, finite=True, **kw):
        return anomalous(loss, True, finite, total, losses, totals, **kw)

    assert not went_wrong()
    assert went_wrong(loss=math.nan)
    assert went_wrong(finite=False)
    assert went_wrong(loss=2.0)  # 3.3x above the recent largest
    assert not went_wrong(loss=0.01)  # a fall is no failure
    assert went_wrong(total=31.0) and went_wrong(total=0.1)  # out of the range 10x
    assert not went_wrong(total=20.0)  # within 10x of the range: a deep net's swing
    assert went_wrong(inputs=(1.0, 255.0)) and went_wrong(inputs=(1.0, math.inf))
    assert not went_wrong(inputs=(1.0, 2.0))
    assert went_wrong(weights=([1.0, 2.0], [1.0, 4.0]))
    assert not went_wrong(weights=([1.0, 2.0], [1.01, 2.02]))
    assert not anomalous(0.5, True, True, 2.5, np.array([]), np.array([]))  # no history


def test_a_gradient_cut_to_zero_at_one_step_is_a_sign_and_one_that_sits_steps_out_is_not():
    recent = [[0.3, 0.02, 1.0]] * RECENT
    assert not gradient_cut([0.3, 0.02, 1.0], recent)
    assert gradient_cut([0.0, 0.0, 1.0], recent)  # the layers before a saturated one
    assert not gradient_cut([0.0, 0.0, 1.0], recent[1:])  # too few steps to tell
    sits_out = [[0.3, 0.0 if k % 3 else 0.02, 1.0] for k in range(RECENT)]
    assert not gradient_cut([0.3, 0.0, 1.0], sits_out)  # (an expert the batch missed)
    unmeasured = [[0.3, math.nan, 1.0]] * RECENT
    assert not gradient_cut([0.3, 0.0, 1.0], unmeasured)
    assert not gradient_cut([0.3, math.nan, 1.0], recent)  # no gradient: not measured
    assert anomalous(0.5, True, True, 2.5, [0.5], [2.5], cut=True)


def test_the_gradients_total_is_over_the_layers_measured():
    assert grad_total([3.0, 4.0, math.nan]) == 5.0
    assert math.isnan(grad_total([math.nan, math.nan])) and math.isnan(grad_total([]))


def test_recent_steps_are_read_from_a_first_step_on():
    recent = Recent()
    for step in range(12):
        recent.add(step, loss=float(step), total=10.0 + step, in_absmax=100.0 + step,
                   finite=step != 11)
    losses, totals = recent.since(6)
    assert losses == [6.0, 7.0, 8.0, 9.0, 10.0, 11.0] and totals[0] == 16.0
    assert len(recent.since(0)[0]) == RECENT  # only the last RECENT are kept
    assert recent.input_before(12) == 111.0 and math.isnan(recent.input_before(14))
    assert not recent.finite_before(12) and recent.finite_before(11)
    assert recent.finite_before(14), "a step not kept says nothing"


def _watched(mode: str, fault_at: int):
    torch.manual_seed(0)
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    losses = []
    with nd.watch(model, layer_hooks=mode) as run:
        for step in range(30):
            x, y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
            if step == fault_at:
                with torch.no_grad():
                    model[4].weight[0, 0] = math.nan
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return run, losses


def test_a_replayed_step_reads_what_the_hooks_read():
    fault = 23  # not a sampled step (every 10th) nor a reference one (powers of 2)
    every, l_every = _watched("every", fault)
    sampled, l_sampled = _watched("sampled", fault)
    assert l_every[:fault] == l_sampled[:fault]
    np.testing.assert_array_equal(sampled.trace.col("act_absmax", fault, fault + 1),
                                  every.trace.col("act_absmax", fault, fault + 1))
    assert np.isnan(sampled.trace.col("act_absmax", fault - 1, fault)).all()  # not hooked
    root = sampled.first_failure
    assert root is not None and root.step == fault and root.layer == "4"
    assert (every.first_failure.step, every.first_failure.layer) == (root.step, root.layer)


def test_a_replayed_output_is_the_trainings_within_rounding_of_its_extent():
    def seen(lo: float, hi: float):
        return output_seen(torch.tensor([lo, 0.5, hi]))

    assert same_output(seen(-2.0, 3.0), seen(-2.0, 3.0))
    assert same_output(seen(-1e-7, 3.0), seen(2e-7, 3.0 + 1e-6))  # rounding near 0
    assert not same_output(seen(-2.0, 3.0), seen(-2.0, 3.03))  # 1% of its extent
    assert same_output(seen(-2.0, math.nan), seen(-2.0, math.nan))  # non-finite alike
    assert not same_output(seen(-2.0, math.nan), seen(-2.0, 3.0))
    assert not same_output(seen(-2.0, 3.0), None)
    big = torch.arange(10_000, dtype=torch.float32).view(100, 100)
    assert output_seen(big)[1].item() == 4095  # the first `CHECKED` values, in memory order
    assert output_seen(big.t())[1].item() == 4095
    assert output_seen(big[:, :50]) is None  # memory with gaps: no fingerprint



class _Stateful(nn.Module):
    """A forward with state of its own besides its weights: Python's and numpy's random
    numbers (a layer drop, a jitter), a generator it holds (noise), a counter of calls, a
    list it logs to, a plain tensor it updates in place (not a buffer), and a warning it
    gives only with gradients off."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 3)
        self.gen = torch.Generator().manual_seed(5)
        self.calls = 0
        self.log: list[float] = []
        self.seen = torch.zeros(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen.mul_(0.9).add_(x.mean(0))
        self.log.append(float(x.abs().max()))
        if not torch.is_grad_enabled():
            warnings.warn("forward run without gradients", UserWarning, stacklevel=2)
        h = torch.relu(self.a(x))
        if random.random() > 0.3:
            h = h + torch.relu(self.b(h))
        h = h * (1 + 0.01 * float(np.random.randn()))
        return self.c(h + 0.01 * torch.randn(h.shape, generator=self.gen))


def _stateful_training(watched: bool) -> tuple:
    """The losses of a training of `_Stateful` whose step 13 gets a batch 50x (a step
    whose layers are not hooked: replayed, or tried), and the state after it."""
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(0)
    model = _Stateful()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(2)
    losses = []
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with nd.watch(model, report=False) if watched else contextlib.nullcontext() as run:
            for step in range(24):
                x = torch.randn(32, 8, generator=gen)
                if step == 13:
                    x = x * 50
                loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
    if watched:
        assert run.trace.scalar("hooked")[13] == 0
        assert run.recorder.replays + (run.recorder.replay_refused is not None) == 1
    return (losses, model.calls, list(model.log), model.seen.tolist(),
            model.gen.get_state().tolist(), random.random(), float(np.random.rand()),
            [str(w.message) for w in shown if "without gradients" in str(w.message)])


def test_a_replay_leaves_no_trace_of_its_forward():
    """Whatever a replayed forward changes when run again (the random states, a
    generator it holds, its counter, its log, a tensor it updates in place) is put back,
    and its warning is not shown: the training and its state after are those of the same
    loop unwatched, bit for bit."""
    plain = _stateful_training(False)
    assert plain[-1] == []  # (the training never runs its forward without gradients)
    assert _stateful_training(True) == plain


def test_a_modules_containers_get_their_contents_back_whatever_they_hold():
    """Lists of one-element tuples, dicts, deques and sets, changed by a replay, get
    their saved contents back in place (compared by identity: no element's `==` runs)."""
    from collections import deque

    from neuraldbg_nb.record.replay_state import _refill
    t = torch.ones(3)
    one, other = (t,), (t,)  # (alike but not the same: a replay rebuilt the element)
    held = [one]
    _refill(held, [other])
    assert held == [other] and held[0] is other
    kept = {"t": t}
    _refill(kept, [("t", t), ("n", 1)])
    assert list(kept) == ["t", "n"] and kept["t"] is t
    window = deque([t, t], maxlen=2)
    _refill(window, [t])
    assert list(window) == [t]
    seen = {1, 2}
    _refill(seen, [3])
    assert seen == {3}
