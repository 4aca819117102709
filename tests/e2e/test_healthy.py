"""Healthy training must stay quiet: no error event, at most one warning, no first failure.

Each architecture is trained for 200 steps with a sane learning rate on data with 10%
label noise (as real data has), and checked to actually learn. A second set trains on
the clean data, where the model fits its batches almost perfectly and the per-batch
gradient norm keeps fluctuating: that is still healthy training.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from models import FACTORIES, train
from torch import nn

import neuraldbg_nb as ndbg
from neuraldbg_nb.live.scans import ScanSchedule
from neuraldbg_nb.trace import HOOK_GAP

STEPS = 200


def _train_watched(arch: str, label_noise: float, seed: int = 0):
    setup = FACTORIES[arch](seed, label_noise=label_noise)
    with ndbg.watch(setup.model, report=False) as run:
        losses = train(setup, STEPS)
    return setup, run, torch.stack(losses)


def _step(opt: torch.optim.Optimizer, loss: torch.Tensor, losses: list[torch.Tensor]) -> None:
    """One plain step of a loop: zero_grad, backward, step; the loss kept."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.detach())


def _quiet_but(run, allowed: tuple | None = None) -> None:
    """No first failure, no error, and no warning other than one that starts with
    `allowed` ((kind, signal, severity, step), as far as it is given)."""
    loud = [e for e in run.events if e.severity != "info"]
    got = [(e.kind, e.signal, e.severity, e.step) for e in loud]
    assert got == [] or (allowed is not None and len(got) == 1
                         and got[0][:len(allowed)] == allowed), [str(e) for e in loud]
    assert run.first_failure is None


def _assert_quiet(run, losses, steps: int = STEPS):
    first, last = losses[:20].mean().item(), losses[-20:].mean().item()
    assert last < 0.7 * first, f"the model did not learn ({first:.3f} -> {last:.3f})"
    loud = [e for e in run.events if e.severity in ("warning", "error")]
    errors = [str(e) for e in loud if e.severity == "error"]
    assert not errors, f"error events on healthy training: {errors}"
    assert len(loud) <= 1, (f"{len(loud)} warnings on healthy training, kinds "
                            f"{sorted({(e.kind, e.signal) for e in loud})}; first ones: "
                            f"{[str(e) for e in loud[:5]]}")
    assert run.first_failure is None
    assert run.trace.n_steps == steps
    assert run.status == "finished"


@pytest.mark.parametrize("arch", list(FACTORIES))
def test_healthy_training_is_quiet(arch):
    _, run, losses = _train_watched(arch, label_noise=0.1)
    _assert_quiet(run, losses)


@pytest.mark.parametrize("arch", list(FACTORIES))
def test_healthy_training_to_a_near_perfect_fit_is_quiet(arch):
    _, run, losses = _train_watched(arch, label_noise=0.0)
    _assert_quiet(run, losses)


def test_healthy_runs_record_every_layer_at_every_measured_step():
    """Every layer's activations at the steps whose layer hooks were on (sampled,
    reference steps, and never more than `HOOK_GAP` apart: none replayed in a healthy run),
    NaN (not measured) at the others; gradients, the loss and weights at every step."""
    _, run, _ = _train_watched("cnn", label_noise=0.1)
    names = run.trace.layer_names
    # forward execution order; dropout-like/reshape modules are not layers
    assert names[:6] == ["0", "1", "2", "3", "4", "5"]
    assert "7" not in names  # nn.Flatten
    hooked = run.trace.scalar("hooked") == 1
    at = np.flatnonzero(hooked)
    assert at[0] == 0 and np.diff(at).max() <= HOOK_GAP and STEPS - 1 - at[-1] < HOOK_GAP
    assert 0 < hooked.sum() < STEPS / 4
    a = run.trace.col("act_absmax")
    assert np.isfinite(a[hooked]).all() and np.isnan(a[~hooked]).all()
    g = run.trace.col("grad_norm")
    for i, info in enumerate(run.trace.layers):
        if info.has_params:
            assert (g[:, i] > 0).all(), f"{info.name}: grad norm missing or zero"
    loss = run.trace.scalar("loss")
    assert (loss > 0).all() and (loss < 10).all()



def test_a_pause_between_steps_does_not_make_every_step_scan():
    # the live run's scan schedule on a 35 ms step, a 3 ms scan and a 5 s pause (an
    # evaluation pass, or the same watch entered again in the next cell)
    schedule = ScanSchedule(ndbg.Thresholds())
    now = 1000.0
    for _ in range(30):
        now += 0.035
        schedule._time_step(now)
    schedule.scanned(0.003)
    before = schedule.interval
    now += 5.0
    schedule._time_step(now)
    schedule.scanned(0.003)
    assert before >= 80  # 3 ms in batches of BUDGET (0.1%) of 35 ms steps
    # counted as a step, the pause would make the average 0.5 s and the batches one step long
    assert schedule.interval >= 0.8 * before


def _binary(hidden: nn.Module):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 20, generator=gen)
    y = (x @ torch.randn(20, generator=gen) > 0).float()[:, None]
    model = nn.Sequential(nn.Linear(20, 64), hidden, nn.Linear(64, 1), nn.Sigmoid())
    return model, x, y


def _train_binary(model, x, y, steps: int, on_step_start=None):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        if on_step_start is not None:
            on_step_start(step)
        i = (step * 64) % len(x)
        opt.zero_grad()
        F.binary_cross_entropy(model(x[i:i + 64]), y[i:i + 64]).backward()
        opt.step()


def test_a_confident_classifiers_output_sigmoid_is_not_saturated():
    """The final sigmoid of a binary classifier that learned is at its bounds by design;
    judged for saturation like a hidden one, it would warn on every healthy run. A hidden
    bounded activation driven into saturation is still found, at its layer and step."""
    model, x, y = _binary(nn.ReLU())
    with ndbg.watch(model, report=False) as run:
        _train_binary(model, x, y, 400)
    assert ((model(x) > 0.5).float() == y).float().mean() > 0.97, "it learned"
    assert not [str(e) for e in run.events if e.severity != "info"]
    assert run.trace.layers[3].role == "other"

    model, x, y = _binary(nn.Tanh())

    def saturate(step):
        if step == 150:
            with torch.no_grad():
                model[0].weight.mul_(50)

    with ndbg.watch(model, report=False) as run:
        _train_binary(model, x, y, 200, on_step_start=saturate)
    found = [(e.step, e.layer) for e in run.events if e.kind == "saturation"]
    assert found and found[0] == (150, "1"), found
    assert run.trace.layers[1].role == "bounded"


class _Returned(nn.Module):
    """The classifier's probabilities returned as users do: squeezed to shape (batch,), or
    after the hidden features in a tuple or a dict."""

    def __init__(self, net: nn.Module, how: str) -> None:
        super().__init__()
        self.net, self.how = net, how

    def forward(self, x: torch.Tensor) -> object:
        if self.how == "squeezed":
            return self.net(x).squeeze(1)
        h = self.net[:2](x)
        p = self.net[2:](h).squeeze(1)
        return (h, p) if self.how == "tuple" else {"features": h, "probability": p}


def _probability(out: object) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else (
        out[1] if isinstance(out, tuple) else out["probability"])


@pytest.mark.parametrize("how", ["squeezed", "tuple", "dict"])
def test_a_classifiers_output_sigmoid_returned_reshaped_or_beside_features_is_not_saturated(how):
    """The same classifier returning its probabilities squeezed (a view of the sigmoid's
    output, not the same tensor), or second in a tuple or a dict (a detector's `(boxes,
    objectness)`): each is still the output's sigmoid, not judged for saturation."""
    net, x, y = _binary(nn.ReLU())
    model = _Returned(net, how)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with ndbg.watch(model, report=False) as run:
        for step in range(400):
            i = (step * 64) % len(x)
            opt.zero_grad()
            F.binary_cross_entropy(_probability(model(x[i:i + 64])), y[i:i + 64, 0]).backward()
            opt.step()
    assert ((_probability(model(x)) > 0.5).float() == y[:, 0]).float().mean() > 0.97
    assert not [str(e) for e in run.events if e.severity != "info"]
    assert run.trace.layers[run.trace.layer_names.index("net.3")].role == "other"


def _fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer,
         steps: int, batch: int, gen: torch.Generator,
         sched: torch.optim.lr_scheduler.LRScheduler | None = None
         ) -> tuple[ndbg.Run, torch.Tensor]:
    """A plain classification loop under the watch, on random batches of (x, y): the
    run and the step losses."""
    losses = []
    with ndbg.watch(model, report=False) as run:
        for _ in range(steps):
            i = torch.randint(0, len(x), (batch,), generator=gen)
            loss = F.cross_entropy(model(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            losses.append(loss.detach())
    return run, torch.stack(losses)


class _ResidualBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus the input: with `zero`, its last BatchNorm's weight starts
    at 0 (torchvision's `zero_init_residual`, the Goyal et al. recipe), so the block starts
    as the identity and its branch gets no gradient at the first step."""

    def __init__(self, c: int, zero: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        if zero:
            nn.init.zeros_(self.bn2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


@pytest.mark.parametrize("init", ["zero_init_residual", "zero_head"])
def test_zero_initialised_layers_under_sgd_momentum_are_quiet(init):
    """A tensor that starts at 0 grows from nothing: with momentum its second update
    triples it (read as a change of size, an `exploding_update` at step 1), and the
    layers upstream of a zero BatchNorm weight get gradients of exactly 0, then 1e-7 and
    climbing (read against the line, a `vanishing_gradient` from step 0). Both are the
    start of healthy training: torchvision's ResNets offer the first, fine-tuning recipes
    use the second."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                          nn.ReLU(), _ResidualBlock(16, init == "zero_init_residual"),
                          nn.MaxPool2d(2), _ResidualBlock(16, init == "zero_init_residual"),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    if init == "zero_head":
        nn.init.zeros_(model[-1].weight)
        nn.init.zeros_(model[-1].bias)
    gen = torch.Generator().manual_seed(0)
    x = F.interpolate(torch.randn(2048, 3, 4, 4, generator=gen), size=16, mode="bilinear")
    x = x + 0.3 * torch.randn(x.shape, generator=gen)
    y = (x.mean((2, 3)) @ torch.randn(10, 3, generator=gen).T).argmax(1)
    steps = 150
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=steps)
    run, losses = _fit(model, x, y, opt, steps, 64, gen, sched)
    _assert_quiet(run, losses, steps)
    # the zero-initialised tensors were seen starting from zeros (`updates.GROWING`)
    zero = ["3.bn2", "5.bn2"] if init == "zero_init_residual" else ["8"]
    ratio = run.trace.col("update_ratio", 0, 1)[0]
    assert [n for n, r in zip(run.trace.layer_names, ratio) if np.isinf(r)] == zero


class _ReZero(nn.Module):
    """x + alpha * f(x), alpha one number that starts at 0 (Bachlechner et al., 2020)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.fc2 = nn.Linear(d, d)
        self.alpha = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.alpha * self.fc2(F.relu(self.fc1(x)))


def test_a_layer_whose_only_parameter_is_one_number_has_no_gradient_regime_shifts():
    """A ReZero gate's gradient is one number: it crosses zero as the gate settles, and
    its norm collapses 129-372x for a step (three warnings in 300 healthy steps, were it
    judged). A layer whose only parameter is one number is not judged for it."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=gen)
    teacher = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10))
    with torch.no_grad():
        y = teacher(x).argmax(1)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(),
                          *[_ReZero(128) for _ in range(3)], nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    run, losses = _fit(model, x, y, opt, 300, 128, gen)
    assert not [str(e) for e in run.events if e.severity != "info"]
    _assert_quiet(run, losses, 300)
    assert [i.params for i in run.trace.layers if i.name in ("2", "3", "4")] == [1] * 3


class _VAE(nn.Module):
    """The VAE of PyTorch's examples (784-400-20), smaller: its loss is summed over the
    batch, so its gradient norms are in the thousands while it learns."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(196, 100)
        self.fc21 = nn.Linear(100, 8)
        self.fc22 = nn.Linear(100, 8)
        self.fc3 = nn.Linear(8, 100)
        self.fc4 = nn.Linear(100, 196)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def test_a_loss_summed_over_the_batch_is_not_an_exploding_gradient():
    """Gradient norms above 1e3 from the first step are the run's scale (a loss summed over
    the batch), not an explosion: an info event says so, and the line moves to 10x that."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    teacher = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 196))
    with torch.no_grad():
        x = torch.sigmoid(10 * teacher(torch.randn(4096, 4, generator=gen)))
    model = _VAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for _ in range(300):
            batch = x[torch.randint(0, len(x), (128,), generator=gen)]
            recon, mu, logvar = model(batch)
            loss = F.binary_cross_entropy(recon, batch, reduction="sum") \
                - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
            _step(opt, loss, losses)
    losses = torch.stack(losses)
    assert losses[-20:].mean() < 0.9 * losses[:20].mean(), "it learned"
    assert np.nanmax(run.trace.col("grad_norm")) > 1e3, "its gradients were above the line"
    assert not [str(e) for e in run.events if e.severity != "info"]
    assert run.first_failure is None
    scale = [e for e in run.events if e.kind == "exploding_gradient"]
    assert [(e.step, e.severity, e.signal) for e in scale] == [(0, "info", "scale")]


def test_online_training_one_sample_a_step_is_quiet():
    """Batch size 1: one sample zeroes about half of a ReLU layer's units by chance (they
    read 55% dead from step 0, where none was dead over a thousand samples), and a
    3-number output's abs-max swings by any factor as predictions cross zero (a "collapse"
    of 18x). Neither is judged on so few values (`reductions.DEAD_MIN_VALUES`,
    `regime.FEW`); a conv layer's units, a feature map each, still are at batch size 1."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    teacher = torch.randn(8, 3, generator=gen)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for _ in range(500):
            x = torch.randn(1, 8, generator=gen)
            loss = F.mse_loss(model(x), torch.tanh(x @ teacher))
            _step(opt, loss, losses)
    _assert_quiet(run, torch.stack(losses), 500)
    assert not [str(e) for e in run.events if e.severity != "info"]
    assert np.isnan(run.trace.col("dead_frac")).all()
    assert [i.outputs for i in run.trace.layers] == [64, 64, 64, 64, 3]

    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    with ndbg.watch(conv, report=False) as run:
        conv(torch.randn(1, 3, 8, 8, generator=gen)).sum().backward()
        run.step()
    assert np.isfinite(run.trace.col("dead_frac")[0, 1])


def test_lbfgs_converging_after_adam_is_not_a_gradient_collapse():
    """The physics-informed workflow: Adam on random collocation points, then L-BFGS on
    fixed ones. L-BFGS takes the loss down 60x in a few steps and every gradient 1000x
    with it: convergence (`regime.converging`), not four gradients "collapsed"."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 1))
    fixed = torch.rand(256, 1, generator=gen)

    def pde_loss(x: torch.Tensor) -> torch.Tensor:  # u'' = -pi^2 sin(pi x), u(0) = u(1) = 0
        x = x.clone().requires_grad_(True)
        u = model(x)
        du = torch.autograd.grad(u.sum(), x, create_graph=True)[0]
        d2u = torch.autograd.grad(du.sum(), x, create_graph=True)[0]
        residual = d2u + math.pi ** 2 * torch.sin(math.pi * x)
        return (residual ** 2).mean() + 10 * (model(torch.tensor([[0.0], [1.0]])) ** 2).mean()

    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    with ndbg.watch(model, report=False) as run:
        for _ in range(300):
            loss = pde_loss(torch.rand(128, 1, generator=gen))
            adam.zero_grad()
            loss.backward()
            adam.step()
        lbfgs = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=20, history_size=50,
                                  line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            lbfgs.zero_grad()
            loss = pde_loss(fixed)
            loss.backward()
            return loss

        for _ in range(10):
            final = lbfgs.step(closure)
    assert final.item() < 1e-3 * run.trace.scalar("loss")[:20].mean(), "it converged"
    assert not [str(e) for e in run.events if e.kind == "regime_shift" and e.severity != "info"]
    assert not [str(e) for e in run.events if e.severity == "error"]


def test_lbfgs_on_one_full_batch_is_full_batch_training_not_repeated_batches():
    """L-BFGS runs its closure, the forward on the same full batch, a varying number of
    times a step (about 20, then 1 once converged). The step's batch is that one batch:
    every step repeats it as every step has so far (full-batch training, info), not "a
    repeat after other batches" wherever two steps ran the same count of forwards."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x = torch.linspace(-3, 3, 200).unsqueeze(1)
    y = torch.sin(2 * x) + 0.1 * torch.randn(x.shape, generator=gen)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=25,
                            line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with ndbg.watch(model, report=False) as run:
        for _ in range(30):
            opt.step(closure)
    assert (run.trace.scalar("in_repeat")[1:] == 1).all()
    assert not [e for e in run.events if e.kind == "data_anomaly" and e.severity != "info"], \
        [str(e) for e in run.events]
    assert not [str(e) for e in run.events if e.severity == "error"]


class _Ragged(nn.Module):
    """Sequences of unlike lengths, given as a list, padded and packed inside."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 8)
        self.gru = nn.GRU(8, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, sequences: list[torch.Tensor], lengths: torch.Tensor) -> torch.Tensor:
        padded = nn.utils.rnn.pad_sequence(sequences, batch_first=True)
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(padded), lengths,
                                                   batch_first=True, enforce_sorted=False)
        return self.head(self.gru(packed)[1][-1])


def test_a_ragged_batch_given_as_a_list_is_not_read_as_its_first_sample():
    """`model(sequences, lengths)`: the first tensor is one sequence (all ones, say), not
    the batch; it is not summarised as the input ("input batch is constant")."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = _Ragged()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with ndbg.watch(model, report=False) as run:
        for _ in range(40):
            lengths = torch.randint(2, 9, (16,), generator=gen)
            sequences = [torch.randint(1, 5, (int(n),), generator=gen) for n in lengths]
            sequences[0] = torch.ones(int(lengths[0]), dtype=torch.long)
            labels = torch.tensor([int((s == 1).sum() > len(s) / 4) for s in sequences])
            opt.zero_grad()
            F.cross_entropy(model(sequences, lengths), labels).backward()
            opt.step()
    assert np.isnan(run.trace.scalar("in_absmax")).all()
    assert not [str(e) for e in run.events if e.kind == "data_anomaly"]
    assert not [str(e) for e in run.events if e.severity == "error"]


def test_an_auxiliary_head_whose_loss_weight_reaches_zero_is_cut_off_not_vanishing():
    """Deep supervision with the auxiliary heads' weight annealed to 0 at step 60: their
    gradients are exactly 0 from there. Nothing of the loss reaches them, on purpose: a
    warning that says what cuts a layer off (signal "cut"), not a vanishing-gradient
    error from step 60 and no first failure. A gradient that is small but not 0 is still
    vanishing (`tests/detect/test_gradients.py`)."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
    model = nn.ModuleDict({"trunk": trunk, "aux": nn.Linear(64, 10), "head": nn.Linear(64, 10)})
    teacher = torch.randn(32, 10, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for step in range(100):
            x = torch.randn(128, 32, generator=gen)
            y = (x @ teacher).argmax(1)
            h = model["trunk"](x)
            weight = max(0.0, 1 - step / 60)
            loss = F.cross_entropy(model["head"](h), y) \
                + weight * F.cross_entropy(model["aux"](h), y)
            _step(opt, loss, losses)
    _assert_quiet(run, torch.stack(losses), 100)
    cut = [(e.layer, e.step, e.signal, e.severity) for e in run.events
           if e.kind == "vanishing_gradient"]
    assert cut == [("aux", 60, "cut", "warning")]
    assert "vanishing gradient (exactly 0: no part of the loss reaches it) in 1 layer from " \
        "step 60 (aux)" in str(run)


class _TopOneMoE(nn.Module):
    """A mixture of 8 experts, each token routed to its most likely expert (Switch-style),
    with the load-balancing loss kept in `aux`."""

    def __init__(self, d: int, experts: int = 8) -> None:
        super().__init__()
        self.gate = nn.Linear(d, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, d)) for _ in range(experts))
        self.aux = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.gate(x).softmax(-1)
        w, idx = p.max(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = (idx == e).nonzero(as_tuple=True)[0]
            if len(sel):
                out = out.index_add(0, sel, expert(x[sel]) * w[sel, None])
        share = F.one_hot(idx, len(self.experts)).float().mean(0)
        self.aux = len(self.experts) * (share * p.mean(0)).sum()
        return out


def test_experts_routed_a_few_tokens_in_a_step_are_quiet():
    """An expert that gets one easy token in a step has its gradient fall 100-10,000x for
    that step and come back at the next: judged on one step, 14 gradient regime-shift
    warnings in 300 steps. A gradient's shift must hold (`regime.GRADIENT_PATIENCE`)."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    centres = torch.randn(40, 16, generator=gen) * 2
    labels = torch.randint(0, 5, (40,), generator=gen)
    moe = _TopOneMoE(32)
    model = nn.ModuleDict({"inp": nn.Linear(16, 32), "moe": moe, "ln": nn.LayerNorm(32),
                           "head": nn.Linear(32, 5)})
    opt = torch.optim.Adam(model.parameters(), 2e-3)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for _ in range(300):
            c = torch.randint(0, 40, (24,), generator=gen)
            h = model["inp"](centres[c] + 0.5 * torch.randn(24, 16, generator=gen))
            h = h + moe(model["ln"](h))
            loss = F.cross_entropy(model["head"](h), labels[c]) + 0.01 * moe.aux
            _step(opt, loss, losses)
    _assert_quiet(run, torch.stack(losses), 300)


class _LoRA(nn.Module):
    """A frozen linear layer plus a trained low-rank update B @ A, B initialised to zeros
    (as in the LoRA paper and peft)."""

    def __init__(self, base: nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + 2.0 * self.lora_B(self.lora_A(x))


def test_lora_under_a_warm_up_from_a_learning_rate_of_zero_is_quiet():
    """Hugging Face's linear warm-up starts at a learning rate of 0: the zero-initialised B
    matrices first move at step 1, which is not sampled, and their second update doubles
    them: the start of a tensor that grows from zeros, not "weights changed by 1.84x their
    size during step 2"."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x = torch.randn(512, 32, generator=gen)
    y = (x @ torch.randn(32, 10, generator=gen)).argmax(1)
    pretrained = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                               nn.Linear(64, 10))
    model = nn.Sequential(_LoRA(pretrained[0]), nn.ReLU(), _LoRA(pretrained[2]), nn.ReLU(),
                          pretrained[4].requires_grad_(False))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 30))
    run, losses = _fit(model, x, y, opt, 200, 64, gen, warm)
    _assert_quiet(run, losses)
    assert run.trace.scalar("lr")[0] == 0.0


def test_a_regression_on_targets_of_order_1000_is_not_an_exploding_gradient():
    """Targets of order 1000 (not normalised) under Adam: the gradient norms start at
    1.3e3 and grow to 2.5e5 as the weights grow to the targets' scale, step by step, while
    the loss falls. Judged by the exploding line alone, that would be an error at step 35
    and eight more after it (`gradients._exploding`)."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x = torch.randn(8192, 8, generator=gen)
    x = (x - x.mean(0)) / x.std(0)
    f = torch.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.5 * x[:, 3] ** 2 + 0.3 * x[:, 4]
    y = (1000 * f + 50 * torch.randn(8192, generator=gen)).unsqueeze(1)
    model = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for _ in range(400):
            i = torch.randint(0, len(x), (128,), generator=gen)
            loss = F.mse_loss(model(x[i]), y[i])
            _step(opt, loss, losses)
    _assert_quiet(run, torch.stack(losses), 400)
    grads = run.trace.col("grad_norm")
    assert np.nanmax(grads) > 10 * np.nanmax(grads[0]) > 1e4  # it did climb past the line


class _LayerScaleBlock(nn.Module):
    """x + gamma * mlp(norm(x)), gamma per channel from 1e-5 (LayerScale: CaiT, ConvNeXt,
    DINOv2)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.gamma = nn.Parameter(torch.full((d,), 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gamma * self.mlp(self.norm(x))


def test_layerscale_gains_from_1e_5_are_quiet():
    """Adam's first steps are 10-100x a LayerScale gain initialised at 1e-5: a tensor that
    small grows from next to nothing, not "weights changed by 100x their size during step
    0" (`updates.TINY`)."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x = torch.randn(512, 32, generator=gen)
    y = (x @ torch.randn(32, 10, generator=gen)).argmax(1)
    model = nn.Sequential(nn.Linear(32, 64), *[_LayerScaleBlock(64) for _ in range(3)],
                          nn.LayerNorm(64), nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run, losses = _fit(model, x, y, opt, 200, 64, gen)
    _assert_quiet(run, losses)


def test_task_heads_trained_in_turn_are_not_cut_off():
    """Five task heads on one trunk, one trained per step, gradients zeroed rather than
    set to None: each head reads exactly 0 four steps in five. None is "cut off" (no
    part of the loss reaches it) by a warning that never ends: each trains in its turn."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
    heads = nn.ModuleList(nn.Linear(64, 10) for _ in range(5))
    model = nn.ModuleDict({"trunk": trunk, "heads": heads})
    teachers = torch.randn(5, 32, 10, generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for step in range(250):
            task = step % 5
            x = torch.randn(64, 32, generator=gen)
            loss = F.cross_entropy(heads[task](trunk(x)), (x @ teachers[task]).argmax(1))
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
    _assert_quiet(run, torch.stack(losses), 250)


def test_an_exact_fit_whose_gradients_shrink_with_its_loss_is_not_vanishing():
    """A linear fit of exact targets (system identification on polynomial features) takes
    the loss from 7.5e-5 to 1.5e-13 in 200 steps, and the gradient from 7.3e-3 to 5.3e-7
    with it: convergence (`gradients.converged`), not "vanishing" at step 270."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    w = torch.randn(15, 2, generator=gen)

    def features(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x ** 2, x[:, :3] * x[:, 3:]], 1)

    model = nn.Linear(15, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for _ in range(400):
            x = torch.rand(128, 6, generator=gen) * 2 - 1
            loss = F.mse_loss(model(features(x)), features(x) @ w)
            _step(opt, loss, losses)
    _assert_quiet(run, torch.stack(losses), 400)
    assert np.nanmin(run.trace.col("grad_norm")) < 1e-6  # it did fall below the line


def test_heavy_tailed_raw_features_under_a_batchnorm_are_not_a_data_error():
    """Raw tabular features, half of them log-normal with sigma 3, normalised by a
    BatchNorm1d as the model's first layer: one batch's abs-max jumps 160x while the
    BatchNorm's output, the gradients and the loss do not move (`data._felt`). It is a
    warning, not an error and the run's first failure."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    scales = torch.logspace(-3, 4, 20)
    teacher = torch.randn(20, 3, generator=gen)
    model = nn.Sequential(nn.BatchNorm1d(20), nn.Linear(20, 128), nn.ReLU(),
                          nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for _ in range(400):
            z = torch.randn(32, 20, generator=gen)
            y = (z @ teacher + 0.3 * torch.randn(32, 3, generator=gen)).argmax(1)
            raw = z * scales
            raw[:, ::2] = torch.exp(3 * z[:, ::2]) * scales[::2]
            loss = F.cross_entropy(model(raw), y)
            _step(opt, loss, losses)
    _quiet_but(run, ("data_anomaly", "input_scale", "warning"))
    assert losses[-1] < losses[0]


def test_a_curriculum_that_makes_the_inputs_harder_is_not_a_divergence():
    """A classifier's inputs turned 5x noisier at step 150 (a curriculum): its loss goes
    0.0009 -> 0.04 in one step. Judged against its recent level alone that is two errors
    (a jump, then a climb over 200 steps measured from before the switch), and
    `stop_on="error"` would stop a training that is fine. The loss is still 55x below
    where it started: a warning at most, and the jump is not also a climb."""
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    proto = torch.randn(10, 64, generator=gen) * 0.3
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for step in range(400):
            y = torch.randint(0, 10, (64,), generator=gen)
            x = proto[y] + (0.1 if step < 150 else 0.5) * torch.randn(64, 64, generator=gen)
            loss = F.cross_entropy(model(x), y)
            _step(opt, loss, losses)
    _quiet_but(run, ("loss_divergence", "loss", "warning", 150))
    assert losses[-1] < 0.05 * losses[0]


class _PromptLM(nn.Module):
    """A frozen model behind a trainable prompt initialised from its word embeddings."""

    def __init__(self, gen: torch.Generator) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 64)
        nn.init.normal_(self.emb.weight, std=0.02)  # GPT-2's initialisation
        rows = torch.randint(0, 50, (8,), generator=gen)
        self.prompt = nn.Parameter(self.emb.weight[rows].detach().clone())
        self.body = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 2))

    def forward(self, x: torch.Tensor, prompt: torch.Tensor | None = None) -> torch.Tensor:
        p = self.prompt if prompt is None else prompt
        h = torch.cat([p.expand(x.shape[0], -1, -1), self.emb(x)], 1)
        return self.body(h.mean(1) * 10)


def test_prompt_tuning_at_its_usual_learning_rate_is_not_an_exploding_update():
    """Prompt tuning: only an 8-token prompt trains, initialised from word embeddings
    (RMS 0.02), with AdamW at lr 0.03. Adam's first step moves every element by the
    learning rate, 1.5x the prompt's size: an update the size of the learning rate, a
    warning at most (`updates.LR_SIZED`), not an error and the first failure."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = _PromptLM(gen)
    teacher = torch.randn(8, 64, generator=gen) * 0.3
    for name, p in model.named_parameters():
        p.requires_grad_(name == "prompt")
    opt = torch.optim.AdamW([model.prompt], lr=3e-2)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for _ in range(200):
            x = torch.randint(0, 50, (64, 12), generator=gen)
            with torch.no_grad():
                y = model(x, teacher).argmax(1)
            loss = F.cross_entropy(model(x), y)
            _step(opt, loss, losses)
    _quiet_but(run, ("exploding_update", "update", "warning", 0))
    assert losses[-1] < 0.1 * losses[0]


def test_a_loop_that_uses_each_batch_four_times_is_quiet():
    """Four optimizer steps per batch (data echoing, an inner loop per task): a repeat of
    the last batch at three steps of four, from the first batch on. That is the loop's
    way, not "a loader stuck" from the second batch on (the one fresh batch between
    repeats would never end such a warning)."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    w = torch.randn(8, 1, generator=gen)
    losses = []
    with ndbg.watch(model, report=False) as run:
        for step in range(300):
            if step % 4 == 0:
                x = torch.randn(64, 8, generator=gen)
                y = torch.tanh(x @ w)
            loss = F.mse_loss(model(x), y)
            _step(opt, loss, losses)
    _quiet_but(run)
    assert losses[-1] < 0.5 * losses[0]


def test_full_batch_rprop_fitting_two_spirals_exactly_within_the_first_steps():
    """Classic full-batch Rprop on two spirals: the loss falls from 0.69 to 5e-5 in 100
    steps and sits at the float32 floor (3e-10) from step 120, where the gradients are
    near nothing. Its four layers' gradients are not "vanishing" at step 102 (with no
    loss level 200 steps back to call it converged) nor at step 313, and a blip of the
    loss at the floor (2.6e-10 -> 3.7e-6) is the loss's own warning, not also four
    gradient jumps from 1e-7."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    t = torch.rand(1000, generator=g) * 3 * math.pi + 0.5
    y = torch.randint(0, 2, (1000,), generator=g).float()
    r, sign = t / (3 * math.pi), y * 2 - 1
    x = 2 * (torch.stack([sign * r * torch.cos(t), sign * r * torch.sin(t)], 1)
             + 0.02 * torch.randn(1000, 2, generator=g))
    model = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                          nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.Rprop(model.parameters(), lr=1e-3)
    losses: list[torch.Tensor] = []
    with ndbg.watch(model, report=False) as run:
        for _ in range(400):
            _step(opt, F.binary_cross_entropy_with_logits(model(x).squeeze(1), y), losses)
    assert losses[-1].item() < 1e-6 * losses[0].item()
    _quiet_but(run, ("loss_divergence", "loss", "warning"))
