"""Built-in examples of trainings that break, with no downloads: used by `make demo`,
`neuraldbg demo` and the docs. Each is a real training of a small model on data made here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

FAULT_STEP = 60
BATCH = 256
"""Batches and layers (1024 units) of the size real trainings use: a step of 64 rows
through 128 units takes about half a millisecond, as long as the debugger's own per-step
work, and the cost it shows would then be a share of the step that no real training
sees."""


def _data(n: int = 160 * BATCH, features: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 4, generator=g)
    return x, (x @ w).argmax(1)


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 4))


def weight_blowup(steps: int = 150) -> Callable[[], None]:
    """A classifier whose middle layer's weights are corrupted (x300) at step 60, as a bad
    checkpoint merge or an in-place bug would do. Returns the training function."""
    model, (x, y) = _mlp(), _data()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def train() -> None:
        for step in range(steps):
            i = (step * BATCH) % (len(x) - BATCH)
            if step == FAULT_STEP:
                with torch.no_grad():
                    model[2].weight.mul_(300)  # type: ignore[operator]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + BATCH]), y[i:i + BATCH]).backward()
            opt.step()

    train.model = model  # type: ignore[attr-defined]
    return train


def nan_batch(steps: int = 120) -> Callable[[], None]:
    """The same classifier fed one batch with a NaN in it at step 60 (a bad row in the
    data): the data is to blame, not the first layer."""
    model, (x, y) = _mlp(), _data()
    x = x.clone()
    x[FAULT_STEP * BATCH + 3, 5] = float("nan")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def train() -> None:
        for step in range(steps):
            i = step * BATCH % (len(x) - BATCH)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + BATCH]), y[i:i + BATCH]).backward()
            opt.step()

    train.model = model  # type: ignore[attr-defined]
    return train


EXAMPLES: dict[str, Callable[..., Callable[[], None]]] = {
    "weight-blowup": weight_blowup,
    "nan-batch": nan_batch,
}
