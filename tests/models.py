"""Tiny models, data and a plain training loop shared by the tests.

Everything is deterministic: each factory seeds its own parameters and draws its data
from its own `torch.Generator`, so the global RNG is only used by the model itself (e.g.
dropout) and two calls with the same seed give bit-identical trainings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

Hook = Callable[[int, nn.Module, torch.optim.Optimizer], None]


@dataclass
class Setup:
    """A model, its data and how it is trained, plus the names of some of its layers."""

    name: str
    model: nn.Module
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[object, torch.Tensor], torch.Tensor]
    make_opt: Callable[[nn.Module], torch.optim.Optimizer]
    layers: dict[str, str] = field(default_factory=dict)
    """Roles -> qualified layer names: 'first' (first layer with parameters in forward
    order), 'mid' (a hidden layer with a weight and a bias), 'head'."""
    float_input: bool = True


def _data(gen: torch.Generator, n: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn((n, *shape), generator=gen)


def _noisy(y: torch.Tensor, classes: int, frac: float, gen: torch.Generator) -> torch.Tensor:
    """Labels with a fraction `frac` replaced by random ones (real data is not clean)."""
    if not frac:
        return y
    flip = torch.rand(len(y), generator=gen) < frac
    return torch.where(flip, torch.randint(0, classes, y.shape, generator=gen), y)


def _batcher(x: torch.Tensor, y: torch.Tensor, size: int, seed: int
             ) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """Batch of step s: a fixed random subset of the dataset (same for the same s)."""
    gen = torch.Generator().manual_seed(seed + 1)
    order = [torch.randperm(len(x), generator=gen)[:size] for _ in range(400)]

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = order[step % len(order)]
        return x[idx].clone(), y[idx].clone()

    return batch


# -- MLP ---------------------------------------------------------------------------------
def mlp(seed: int = 0, *, dropout: float = 0.0, lr: float = 0.05, adam: bool = False,
        label_noise: float = 0.0) -> Setup:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(10, 32), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers += [nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)]
    model = nn.Sequential(*layers)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    gen = torch.Generator().manual_seed(seed + 100)
    x = _data(gen, 512, (10,))
    teacher = torch.randn(10, 4, generator=gen)
    y = _noisy((x @ teacher + 0.3 * torch.randn(512, 4, generator=gen)).argmax(1), 4,
               label_noise, gen)
    opt = (lambda m: torch.optim.Adam(m.parameters(), lr=lr / 10)) if adam else \
        (lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9))
    return Setup("mlp", model, _batcher(x, y, 32, seed), F.cross_entropy, opt,
                 {"first": names[0], "mid": names[1], "head": names[2]})


# -- CNN with BatchNorm -----------------------------------------------------------------
def cnn(seed: int = 0, *, lr: float = 0.05, adam: bool = False, label_noise: float = 0.0) -> Setup:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),      # 0 1 2
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),      # 3 4 5
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3),           # 6 7 8
    )
    gen = torch.Generator().manual_seed(seed + 200)
    y = torch.randint(0, 3, (384,), generator=gen)
    x = 0.5 * _data(gen, 384, (1, 8, 8))
    x[y == 0, :, :4] += 1.0          # class 0: bright top half
    x[y == 1, :, :, :4] += 1.0       # class 1: bright left half
    y = _noisy(y, 3, label_noise, gen)
    opt = (lambda m: torch.optim.Adam(m.parameters(), lr=lr / 10)) if adam else \
        (lambda m: torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9))
    return Setup("cnn", model, _batcher(x, y, 32, seed), F.cross_entropy, opt,
                 {"first": "0", "mid": "3", "norm": "4", "head": "8"})


# -- RNN --------------------------------------------------------------------------------
class SeqClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def rnn(seed: int = 0, *, lr: float = 0.01, label_noise: float = 0.0) -> Setup:
    torch.manual_seed(seed)
    model = SeqClassifier()
    gen = torch.Generator().manual_seed(seed + 300)
    x = _data(gen, 384, (12, 4))
    y = _noisy((x[:, :, 0].sum(1) > 0).long(), 2, label_noise, gen)  # sign of a sum
    return Setup("rnn", model, _batcher(x, y, 32, seed), F.cross_entropy,
                 lambda m: torch.optim.Adam(m.parameters(), lr=lr),
                 {"first": "rnn", "mid": "rnn", "head": "head"})


# -- small transformer over integer tokens ----------------------------------------------
class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 16, d: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.emb(tokens)).mean(1))


def transformer(seed: int = 0, *, lr: float = 2e-3, label_noise: float = 0.0) -> Setup:
    torch.manual_seed(seed)
    model = TinyTransformer()
    gen = torch.Generator().manual_seed(seed + 400)
    x = torch.randint(0, 16, (384, 10), generator=gen)
    y = _noisy(((x < 8).sum(1) > 5).long(), 2, label_noise, gen)  # more small tokens
    return Setup("transformer", model, _batcher(x, y, 32, seed), F.cross_entropy,
                 lambda m: torch.optim.Adam(m.parameters(), lr=lr),
                 {"first": "emb", "mid": "encoder.layers.0.linear1",
                  "bias": "encoder.layers.0.linear2", "nan": "encoder.layers.1.linear1",
                  "norm": "encoder.layers.1.norm1", "head": "head"},
                 float_input=False)


FACTORIES: dict[str, Callable[..., Setup]] = {
    "mlp": mlp, "cnn": cnn, "rnn": rnn, "transformer": transformer}


# -- the training loop ------------------------------------------------------------------
def train(setup: Setup, steps: int, *, opt: torch.optim.Optimizer | None = None,
          on_step_start: Hook | None = None,
          on_batch: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
          before_update: Hook | None = None, after_update: Hook | None = None,
          losses: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """A plain loop: zero_grad, forward, loss, backward, step. Returns the step losses."""
    model = setup.model
    opt = opt if opt is not None else setup.make_opt(model)
    losses = [] if losses is None else losses
    model.train()
    for step in range(steps):
        if on_step_start is not None:
            on_step_start(step, model, opt)
        x, y = setup.batch(step)
        if on_batch is not None:
            x = on_batch(step, x)
        opt.zero_grad()
        loss = setup.loss_fn(model(x), y)
        loss.backward()
        if before_update is not None:
            before_update(step, model, opt)
        opt.step()
        if after_update is not None:
            after_update(step, model, opt)
        losses.append(loss.detach().clone())
    return losses


def module(model: nn.Module, name: str) -> nn.Module:
    return model.get_submodule(name)


def weight_of(model: nn.Module, name: str) -> nn.Parameter:
    m = module(model, name)
    if isinstance(m, nn.LSTM | nn.GRU):
        return m.weight_ih_l0
    if isinstance(m, nn.Embedding):
        return m.weight
    return m.weight


def bias_of(model: nn.Module, name: str) -> nn.Parameter:
    m = module(model, name)
    if isinstance(m, nn.LSTM | nn.GRU):
        return m.bias_ih_l0
    return m.bias


# -- GAN -----------------------------------------------------------------------------------

@dataclass
class Gan:
    """A tiny GAN on 2-d points: a generator and a discriminator, each with its own Adam
    (betas as GANs use them), and a generator of the real points' noise."""

    G: nn.Module
    D: nn.Module
    opt_g: torch.optim.Optimizer
    opt_d: torch.optim.Optimizer
    gen: torch.Generator


def gan(seed: int = 0) -> Gan:
    torch.manual_seed(seed)
    G = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    return Gan(G, D, torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999)),
               torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999)),
               torch.Generator().manual_seed(7))


def measured(run, column: str = "act_absmax"):
    """The activation column `column` at the steps whose layer hooks were on (hooked, or
    replayed: the trace's `hooked` scalar), the only steps where it is measured under the
    default sampled hooks."""
    return run.trace.col(column)[run.trace.scalar("hooked") == 1]
