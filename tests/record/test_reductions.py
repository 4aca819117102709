"""Device-side summaries against plain PyTorch: norms of mixed tensors (half precision,
sparse, non-contiguous, several dtypes, non-finite; small ones in stacks), the weight
probe's stacks following weights that change in place, the maxima taken from the layer
before, and the rich statistics taken in batches."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.record import inputs, reductions, step_row


def test_grouped_norms_match_vector_norm_whatever_the_mix() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(128, generator=g), torch.randn(64, 70, generator=g),
        torch.randn(3, 3, generator=g).t(),  # not contiguous, normed in a stack of two
        torch.randn(3, 3, generator=g).t() * 10,
        torch.randn(16, generator=g).half() * 1000,  # float16: accumulated in float32
        torch.randn(16, generator=g).half() * 1000,
        torch.randn(5, dtype=torch.float64, generator=g),
        torch.sparse_coo_tensor([[0, 3]], [3.0, 4.0], (10,), check_invariants=True),
        torch.tensor([1.0, math.inf]), torch.tensor([math.nan, 1.0]),
    ]
    sc = reductions.Scalars()
    plan = reductions.NormPlan()  # the grouping, kept from call to call
    # the same kinds twice (the second call reuses the grouping), then other kinds: a
    # tensor of another shape where a stack of two was, and one tensor fewer
    for ts in (tensors, tensors, [torch.randn(4, 2, generator=g)] + tensors[3:-1]):
        sc.add(torch.tensor(7.0))  # positions count from what the step holds already
        pos = reductions.grouped_norms(ts, sc, plan)
        v = sc.to_host()
        got = [v[p] for p in pos]
        want = [torch.linalg.vector_norm(t.to_dense().double()).item() for t in ts]
        assert len(got) == len(ts)
        for a, b in zip(got, want):
            assert math.isclose(a, b, rel_tol=2e-3) or (math.isnan(a) and math.isnan(b)), (a, b)
    pos = reductions.grouped_norms(tensors, sc)  # no plan: grouped at the call
    v = sc.to_host()
    sparse, inf, nan = (v[p] for p in pos[-3:])
    assert sparse == 5.0 and inf == math.inf and math.isnan(nan)


def test_norms_asked_for_by_several_parts_come_from_one_op_per_device_and_dtype(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`Scalars.norms` from several parts of a step, between values of other kinds: each
    norm lands at its position, and each (device, dtype, accumulation) takes one
    `_foreach_norm` when the values go to the host."""
    g = torch.Generator().manual_seed(3)
    calls = []
    foreach = torch._foreach_norm

    def counted(ts, *args, **kwargs):
        calls.append(len(ts))
        return foreach(ts, *args, **kwargs)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    grads = [torch.randn(5, 4, generator=g), torch.randn(3, generator=g)]
    slices = [torch.randn(7, generator=g)]
    halves = [torch.randn(9, generator=g).half() * 500]
    doubles = [torch.randn(6, dtype=torch.float64, generator=g)]
    sc = reductions.Scalars()
    first = sc.add(torch.tensor(-1.0))
    p_grads = sc.norms(grads)
    between = sc.extend([torch.tensor(2.0), torch.tensor(3.0)])
    p_halves = sc.norms(halves, torch.float32)
    p_slices = sc.norms(slices)
    p_doubles = sc.norms(doubles)
    assert calls == []  # nothing is read before the transfer
    v = sc.to_host()
    assert sorted(calls) == [1, 1, 3]  # float32 (two parts), float16 in float32, float64
    assert v[first] == -1.0 and v[between:between + 2] == [2.0, 3.0]
    for start, ts in ((p_grads, grads), (p_halves, halves), (p_slices, slices),
                      (p_doubles, doubles)):
        for k, t in enumerate(ts):
            want = torch.linalg.vector_norm(t.double()).item()
            assert math.isclose(v[start + k], want, rel_tol=1e-3), (start, k)
    assert len(sc) == 0 and sc.to_host() == []
    assert sc.norms([]) == 0 and len(sc) == 0  # none asked for: nothing queued


def test_the_transfer_keeps_the_order_of_values_of_mixed_dtypes() -> None:
    """A sampled step queues float32 statistics between integer counts (and float64 ones
    for a float64 model): the transfer joins them by dtype, and each value must come back
    at the position it was queued at, exactly (a count above 2**24 included)."""
    sc = reductions.Scalars()
    big = 2 ** 24 + 1  # a count float32 would round
    queued = [
        (sc.add(torch.tensor(1.5)), 1.5),
        (sc.add_row(torch.tensor([3, big], dtype=torch.int64)), [3.0, float(big)]),
        (sc.extend([torch.tensor(0.25), torch.tensor(-2.0)]), [0.25, -2.0]),
        (sc.add(torch.tensor(1e200, dtype=torch.float64)), 1e200),
        (sc.add(torch.tensor(7, dtype=torch.int64)), 7.0),
        (sc.add(torch.tensor(math.nan)), math.nan),
    ]
    want: list[float] = []
    for _, x in queued:
        want += x if isinstance(x, list) else [x]
    assert [start for start, _ in queued] == [0, 1, 3, 5, 6, 7]
    got = sc.to_host()
    assert len(got) == len(want) == 8
    assert got[:7] == want[:7] and math.isnan(got[7]), got
    assert not sc.from_device and len(sc) == 0  # emptied for the next step

def test_the_weight_probe_follows_every_update_of_a_channels_last_model() -> None:
    """The probe's slices are views kept from step to step: a copy taken by mistake (a
    reshape of a non-contiguous weight) would leave the weight norms frozen."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 3)).to(memory_format=torch.channels_last)
    assert not model[0].weight.is_contiguous()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with ndbg.watch(model, report=False) as run:
        for _ in range(12):
            x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 3, (4,))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    df = run.to_dataframe()
    for layer in ("0", "3"):
        norms = df[df.layer == layer].sort_values("step").param_norm.to_numpy()
        assert len(norms) == 12 and (norms[1:] != norms[:-1]).all(), (layer, norms)
        ratios = df[(df.layer == layer) & df.update_ratio.notna()].update_ratio
        assert len(ratios) >= 1 and (ratios > 0).all()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed", "sliced"])
@pytest.mark.parametrize("fault", ["none", "nan", "inf"])
def test_min_max_and_the_batch_summary_read_every_element_whatever_the_layout(
        layout: str, fault: str) -> None:
    """`min_max` and `inputs.input_batch` reduce a non-contiguous tensor in its memory order (or
    with two passes where it has gaps): the same minimum, maximum, sum and non-finite
    flag as the plain reductions, with the fault put in the last element in memory."""
    torch.manual_seed(0)
    base = torch.randn(4, 6, 5, 7)
    x = {"contiguous": base,
         "channels_last": base.contiguous(memory_format=torch.channels_last),
         "transposed": base.transpose(1, 3),
         "sliced": base[:, ::2]}[layout]
    if layout != "contiguous":
        assert not x.is_contiguous()
    value = {"none": 0.5, "nan": math.nan, "inf": math.inf}[fault]
    memory_order = reductions.dense(x)
    if memory_order is not None:
        memory_order.view(-1)[-1] = value  # the last element in memory
    else:  # gaps: the last element in index order
        x[(-1,) * x.dim()] = value
    assert torch.isfinite(x).all().item() == (fault == "none")
    mn, mx = reductions.min_max(x)
    assert torch.equal(mn, x.amin()) or (fault == "nan" and mn.isnan()), (mn, x.amin())
    assert torch.equal(mx, x.amax()) or (fault == "nan" and mx.isnan()), (mx, x.amax())
    sc = reductions.Scalars()
    pos = inputs.input_batch(x, True, sc, inputs.Ramps())
    v = sc.to_host()
    assert v[pos["min"]] == pytest.approx(x.amin().item(), nan_ok=True)
    assert v[pos["max"]] == pytest.approx(x.amax().item(), nan_ok=True)
    assert v[pos["sum"]] == pytest.approx(x.sum().item(), rel=1e-5, nan_ok=True)
    assert v[pos["nonzero"]] == torch.count_nonzero(x).item()
    finite = torch.isfinite(x).sum().item()
    assert (pos["finite"] == -1 and finite == x.numel()) or v[pos["finite"]] == finite


def test_a_channels_last_cnn_gets_the_true_abs_max_of_every_layer() -> None:
    """The cheap path on channels-last conv outputs (read in memory order): the traced
    abs-max of each layer is that of its real output, step by step."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Tanh(), nn.Conv2d(8, 4, 3),
                          nn.Flatten(), nn.Linear(4 * 4 * 4, 3)).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: dict[str, list[float]] = {}
    hooks = [m.register_forward_hook(lambda m, a, y, n=n: seen.setdefault(n, []).append(
        y.detach().abs().max().item())) for n, m in model.named_children()]
    with ndbg.watch(model, report=False, layer_hooks="every", sample_every=1000) as run:
        for _ in range(6):
            x = torch.randn(5, 3, 8, 8).contiguous(memory_format=torch.channels_last)
            opt.zero_grad()
            out = model(x)
            nn.functional.cross_entropy(out, torch.randint(0, 3, (5,))).backward()
            opt.step()
    for h in hooks:
        h.remove()
    assert not model[0](x).is_contiguous()  # the conv outputs really are channels-last
    df = run.to_dataframe()
    watched = set(df.layer)
    assert {"0", "1", "2", "3", "5"} <= watched
    for name in watched:
        values = seen[name]
        traced = df[df.layer == name].sort_values("step").act_absmax.to_numpy()
        assert traced == pytest.approx(values, rel=1e-6), name


def test_weight_norms_and_update_sizes_are_those_of_the_real_weights() -> None:
    """The after-update copy of the weight probe goes into one buffer reused at every
    step; the copy before a sampled update must stay apart from it, or the update sizes
    read 0. 12 layers of 64x64: the stack is over glibc's mmap threshold, as on the
    benchmark MLPs."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(12)], nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    after = []  # per step, per layer: its weight and bias after the update
    with ndbg.watch(model, report=False, sample_every=5) as run:
        for _ in range(12):
            x, y = torch.randn(16, 64), torch.randint(0, 3, (16,))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            after.append([torch.cat([m.weight.detach().reshape(-1), m.bias.detach()]).clone()
                          for m in model])
    norms = run.trace.col("param_norm")
    ratios = run.trace.col("update_ratio")
    for step in range(12):
        for layer, w in enumerate(after[step]):
            assert norms[step, layer] == pytest.approx(w.norm().item(), rel=1e-5)
            if step % 5 == 0 and step > 0:  # sampled: the update of this step
                moved = (w - after[step - 1][layer]).norm() / after[step - 1][layer].norm()
                assert ratios[step, layer] == pytest.approx(moved.item(), rel=1e-4)
    assert (ratios[5] > 0).all() and (ratios[10] > 0).all()


def test_zeros_counted_from_signs_match_a_plain_count() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 500, generator=g)
    x[x.abs() < 0.5] = 0.0  # about 38% exact zeros, in a tensor sampled for fractions
    for t, nonneg in ((x, False), (x.relu(), True), (x[:40], False)):
        sc = reductions.Scalars()
        fast = reductions.rich_activation(t, "linear", None, sc, finite=True, nonneg=nonneg)
        plain = reductions.rich_activation(t, "linear", None, sc, finite=False)
        v = sc.to_host()
        assert fast[7] == plain[7] and v[fast[2]] == v[plain[2]] > 0, (v[fast[2]], v[plain[2]])


class _EditsInPlace(nn.Module):
    """A ReLU whose input was changed in place after the layer before it was read."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h.mul_(-3.0)
        return self.act(h)


class _Wraps(nn.Module):
    """A layer with a parameter of its own that returns its inner layer's output: the
    very tensor whose extremes the inner layer's hook just read, or (`edit`) that tensor
    changed in place after they were read."""

    def __init__(self, edit: bool) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(8))
        self.inner = nn.Linear(8, 8)
        self.edit = edit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x + self.shift)
        if self.edit:
            out.add_(5.0)
        return out


def test_relu_maxima_taken_from_the_layer_before_match_the_real_ones() -> None:
    """A ReLU fed by the layer just reduced is not reduced again (its max is that
    layer's, floored at 0), nor is a layer returning the output just reduced: the
    recorded abs-max must be the real one for a plain ReLU, an in-place one, one whose
    input was edited in place in between, a wrapper returning its inner layer's output
    as it is and after an in-place edit, and at a NaN."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(inplace=True),
                          _EditsInPlace(), _Wraps(edit=False), _Wraps(edit=True),
                          nn.Linear(8, 2))
    with torch.no_grad():
        model[2].bias.fill_(-100.0)  # every unit of the ReLU after it is zero: max 0
    real: dict[str, list[float]] = {}
    for name, m in model.named_modules():
        if isinstance(m, (nn.ReLU, nn.Linear, _Wraps)):
            m.register_forward_hook(lambda m, a, out, name=name: real.setdefault(name, []).append(
                out.detach().abs().max().item()))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with ndbg.watch(model, report=False, layer_hooks="every") as run:
        for step in range(6):
            if step == 4:
                with torch.no_grad():
                    model[0].weight[0, 0] = math.nan
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 2, (16,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    t = run.trace
    got = t.col("act_absmax", 0, t.n_steps)
    for name, values in real.items():
        col = got[:, t.layer_names.index(name)].astype(float)
        want = torch.tensor(values).float().numpy().astype(float)
        recorded = [v if math.isfinite(v) else math.inf for v in want]  # non-finite: inf
        assert col.tolist() == recorded, name
    assert real["3"][0] == 0.0 and real["4.act"][0] > 0
    assert math.isinf(got[4, t.layer_names.index("1")])


class _Mixed(nn.Module):
    """Small activations of several shapes and roles (batched), one edited in place after
    its hook, and one too large to batch whole (its sample is)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.act1 = nn.ReLU()
        self.fc = nn.Linear(144, 32)
        self.tanh = nn.Tanh()
        self.fc2 = nn.Linear(32, 32)
        self.act2 = nn.ReLU()
        self.big = nn.Linear(32, 9000)  # 72,000 elements a batch: the per-layer path
        self.head = nn.Linear(9000, 3)
        with torch.no_grad():
            self.fc.weight.mul_(50.0)  # some tanh outputs saturate
            self.fc2.bias[:10] = 100.0  # -300 after the edit below: dead units in act2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tanh(self.fc(self.act1(self.conv(x)).flatten(1)))
        h = self.fc2(h)
        h.mul_(-3.0)  # fc2's output changes after its hook read it
        return self.head(self.big(self.act2(h)))


def _real_stats(y: torch.Tensor, name: str, sampled: bool = False) -> dict[str, float]:
    """The statistics of `y`; `sampled`: the mean, std and zero fraction of the evenly
    strided sample that stands for an activation too large to batch whole."""
    x = y.detach().double()
    if sampled:
        s = x.reshape(-1)[::reductions._stride(x.numel())]
        mean = s.mean().item()
        return {"act_mean": mean, "zero_frac": (s == 0).double().mean().item(),
                "act_std": math.sqrt(max((s * s).mean().item() - mean**2, 0.0))}
    mean = x.mean().item()
    out = {"act_mean": mean, "act_std": math.sqrt(max((x * x).mean().item() - mean**2, 0.0)),
           "zero_frac": (x == 0).double().mean().item()}
    if name.startswith("act"):
        units = x.amax(dim=[0, 2, 3] if x.dim() == 4 else [0])
        out["dead_frac"] = (units <= 0).double().mean().item()
    if name == "tanh":
        out["sat_frac"] = (x.abs() >= 0.98).double().mean().item()
    return out


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("batched", [True, False])
def test_rich_statistics_of_small_activations_taken_in_batches_are_the_real_ones(
        batched: bool, layout: torch.memory_format) -> None:
    """Sampled steps copy small activations into shared buffers and read them together at
    the step's end: the numbers must be those of each activation as its layer returned
    it (fc2's output is edited in place afterwards), and the same as the per-layer path
    gives (`batched=False`: no room for buffers), whatever the conv output's layout
    (channels-last: read in memory order). A large activation's mean, std and zero
    fraction are those of its evenly strided sample, and close to the whole's."""
    torch.manual_seed(0)
    model = _Mixed().to(memory_format=layout)
    real: dict[tuple[int, str], dict[str, float]] = {}
    whole: dict[int, dict[str, float]] = {}  # the large activation's own statistics
    step = [0]

    def hear(m: nn.Module, a: tuple, out: torch.Tensor, name: str) -> None:
        big = name == "big"
        real[(step[0], name)] = _real_stats(out, name, sampled=big)
        if big:
            whole[step[0]] = _real_stats(out, name)

    for name, m in model.named_children():
        m.register_forward_hook(lambda m, a, out, name=name: hear(m, a, out, name))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    w = ndbg.watch(model, report=False, sample_every=1)
    w._probe._forward._batch_rows.max_bytes = reductions.BATCH_BYTES if batched else 0
    with w as run:
        for step[0] in range(3):
            x, y = torch.randn(8, 3, 6, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.contiguous(memory_format=layout)), y).backward()
            opt.step()
        assert (w._probe._forward._batch_rows.nbytes > 0) == batched
    df = run.to_dataframe().set_index(["step", "layer"])
    assert real[(0, "act2")]["dead_frac"] >= 10 / 32 and real[(0, "tanh")]["sat_frac"] > 0.05
    for (s, name), want in real.items():
        for col, value in want.items():
            got = float(df.loc[(s, name), col])
            tol = 0.02 if name == "big" and col == "zero_frac" else 1e-5  # big: a sample
            assert math.isclose(got, value, rel_tol=1e-4, abs_tol=tol), (s, name, col, got, value)
    for s, want in whole.items():  # the sample stands for the whole
        got = df.loc[(s, "big")]
        assert math.isclose(float(got["act_std"]), want["act_std"], rel_tol=0.03)
        assert abs(float(got["act_mean"]) - want["act_mean"]) < 0.03 * want["act_std"]


def test_a_large_activations_sample_walks_across_its_columns_and_its_dead_units_are_exact(
        ) -> None:
    """The sample of an activation too large to batch whole takes at most `SAMPLE` of its
    elements, and its odd stride reaches every column of a feature map whose sizes are
    powers of two; dead units are read from every element: a channel zero everywhere but
    at one element that the sample skips is alive."""
    x = torch.zeros(64, 32, 8, 8)
    part = reductions.sample_of(x)
    assert part is not None and 0 < part.numel() <= reductions.SAMPLE
    index = torch.arange(x.numel()).view(-1)[::reductions._stride(x.numel())]
    assert set((index % 8).tolist()) == set(range(8))  # every column of the maps
    assert set(((index // 64) % 32).tolist()) == set(range(32))  # every channel
    taken = torch.zeros(x.numel(), dtype=torch.bool)
    taken[index] = True
    n, h, w = (int(i) for i in torch.nonzero(~taken.view(64, 32, 8, 8)[:, 0])[0])
    x[:, 1:] = 1.0  # channels 1..31 alive; channel 0 alive only at one skipped element
    x[n, 0, h, w] = 1.0
    sc = reductions.Scalars()
    pos, units = reductions.dead_units(x, "relu", sc)
    assert units == 32 and sc.to_host()[pos] == 0.0
    x[n, 0, h, w] = 0.0
    pos, _ = reductions.dead_units(x, "relu", sc)
    assert sc.to_host()[pos] == 1.0


def test_a_sampled_steps_values_go_to_the_host_in_one_join() -> None:
    """Counts are taken in float32, so the values of a sampled step of a float32 model
    share one dtype: one `torch.cat` and one copy to the host."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 64, 32), nn.Sigmoid(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    dtypes: list[set[torch.dtype]] = []
    to_host = reductions.Scalars.to_host

    def spy(self: reductions.Scalars) -> list[float]:
        if self._later:
            self._take_norms()
        dtypes.append({c.dtype for _, c in self._chunks if c is not None})
        return to_host(self)

    g = torch.Generator().manual_seed(1)
    reductions.Scalars.to_host = spy  # type: ignore[method-assign]
    try:
        with ndbg.watch(model, report=False, sample_every=1) as run:
            for _ in range(3):
                opt.zero_grad()
                x, y = torch.randn(64, 1, 8, 8, generator=g), torch.randint(0, 3, (64,), generator=g)
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    finally:
        reductions.Scalars.to_host = to_host  # type: ignore[method-assign]
    assert run.trace.scalar("sampled", 0, 3).tolist() == [1.0, 1.0, 1.0]
    assert dtypes and all(d == {torch.float32} for d in dtypes), dtypes
    sat = run.trace.col("sat_frac", 0, 3)[:, run.trace.layer_names.index("5")]
    dead = run.trace.col("dead_frac", 0, 3)[:, run.trace.layer_names.index("2")]
    assert (sat >= 0).all() and (dead >= 0).all()  # measured, from the counts


def test_batched_rows_stay_within_their_memory_and_free_shapes_no_longer_seen() -> None:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(4, 5, generator=g) for _ in range(4)]
    batch = reductions.RichBatch(max_bytes=3 * rows[0].numel() * 4)
    got = [batch.add(r, "other", None, False) for r in rows]
    assert [x is not None for x in got] == [True, True, True, False]  # the fourth: no room
    assert batch.nbytes == batch.max_bytes
    sc = reductions.Scalars()
    first = batch.reduce(sc)
    v = sc.to_host()
    for r, (key, row) in zip(rows, got[:3]):
        assert math.isclose(v[first[key][0] + row], r.sum().item(), rel_tol=1e-5)
        assert math.isclose(v[first[key][1] + row], r.norm().item(), rel_tol=1e-5)
    # a step with another shape only: no room for it yet (the per-layer path takes it);
    # the shape not seen in that step is freed when it closes, and the next one fits
    assert batch.add(torch.ones(2, 2), "relu", None, True) is None
    batch.reduce(reductions.Scalars())
    assert batch.nbytes == 0
    assert batch.add(torch.ones(2, 2), "relu", None, True) is not None
    assert batch.nbytes == 8 * 2 * 2 * 4  # eight rows to begin with


def test_the_input_fingerprint_weighs_by_position_with_a_bounded_ramp() -> None:
    """One-hot batches differ only in where the one is: the weighted sum tells them apart.
    Above `RAMP_MAX` elements the weights repeat (position modulo it), so no ramp as large
    as an image batch is held, on an accelerator least of all."""
    ramps = inputs.Ramps()
    n = 2 * inputs.RAMP_MAX + 5
    w = inputs._scattered(inputs.RAMP_MAX).float()
    sums = []
    for hot in (10, 11, inputs.RAMP_MAX + 12, n - 1):
        x = torch.zeros(n)
        x[hot] = 1.0
        sums.append(float(inputs._weighed(x, ramps)))
    assert sums == [float(w[i]) for i in (10, 11, 12, (n - 1) % inputs.RAMP_MAX)]
    assert len(set(sums[:2])) == 2
    assert all(r.numel() <= inputs.RAMP_MAX for r in ramps._kept.values())
    small = torch.randn(300).to(torch.bfloat16)  # weighed in float32: exact weights
    one_hot = torch.zeros(300, dtype=torch.bfloat16)
    one_hot[299] = 1
    assert float(inputs._weighed(one_hot, ramps)) == float(w[299])
    assert float(inputs._weighed(small, ramps)) == pytest.approx(
        float((small.float() * w[:300]).sum()), rel=1e-5)


def test_the_input_fingerprints_weights_have_no_pattern_that_cancels() -> None:
    """Batches of 16 one-hot rows of 6 states: every pair of distinct batches of 2,000 has
    its own weighted sum. With weights i (or frac(i x golden ratio)) two batches whose
    states add up alike (or differ alike) would have the same one."""
    gen = torch.Generator().manual_seed(0)
    states = torch.randint(0, 6, (2000, 16), generator=gen)
    ramps = inputs.Ramps()
    prints = {}
    for s in states:
        x = torch.nn.functional.one_hot(s, 6).float().view(-1)
        prints.setdefault(float(inputs._weighed(x, ramps)), set()).add(tuple(s.tolist()))
    assert all(len(batches) == 1 for batches in prints.values())


def test_values_beyond_float32_become_inf_in_the_row_without_a_numpy_warning():
    """A float64 model diverging to 1e211 (the trace's columns are float32): numpy's
    "overflow encountered in cast" reached the user's output at every step."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        row = step_row.absmax([0, 1], [-1.0, -8.9e211], [2.0, 3.0], 2)
        norms = step_row.layer_norms([3.0, 1e211], [([0, 1], [0, 1])], 2)
    assert row.tolist() == [2.0, math.inf]
    assert norms[0].tolist() == [3.0, math.inf]


def test_nonzero_counts_from_signs_match_a_plain_count_and_non_finite_ones_are_counted_apart(
        ) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(70000, generator=g)
    x[x.abs() < 0.3] = 0.0
    want = int(torch.count_nonzero(x))
    got = reductions.nonzero_count(x, finite=True)
    assert got.dtype == torch.float32 and int(got) == want
    x[5] = math.nan  # a NaN's sign is NaN: not known finite, counted as an integer
    got = reductions.nonzero_count(x, finite=False)
    assert got.dtype == torch.int64 and int(got) == int(torch.count_nonzero(x))
