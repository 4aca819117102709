"""What the lessons share: the digits, their mini-batches, the test accuracy, a small
classifier, and the line that ends each lesson.

Each lesson imports what it uses from here (`from lessons import ...`): a notebook's kernel
starts in this folder, so the import finds this file. Importing it puts torch on one thread:
small models train fastest on one, and shared machines (Binder's among them) advertise more
cores than they give.

The data is `load_digits` from scikit-learn, shipped with the package, so nothing is
downloaded: 1,797 handwritten digits of 8x8 pixels, each pixel an integer from 0 to 16.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import torch
from sklearn.datasets import load_digits
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)

_digits = load_digits()

images = torch.tensor(_digits.images, dtype=torch.float32).unsqueeze(1)
"""Every digit as one channel of 8x8 pixels, (1797, 1, 8, 8), values 0..16."""
labels = torch.tensor(_digits.target)
"""The digit each image shows, 0..9."""

_split = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))
train_idx, test_idx = _split[:1500], _split[1500:]
"""1,500 images to train on; 297 kept aside to measure accuracy on digits never trained on."""

X_train, y_train = images[train_idx].flatten(1) / 16, labels[train_idx]
"""The training images as rows of 64 pixels scaled to 0..1, and their labels."""
X_test, y_test = images[test_idx].flatten(1) / 16, labels[test_idx]
"""The test images, the same way."""


def batches(X: Tensor, y: Tensor, epochs: int, batch_size: int = 64,
            seed: int = 0) -> Iterator[list[Tensor]]:
    """Shuffled mini-batches `(xb, yb)` over `epochs` passes; the same ones on every run with
    the same seed. A last batch smaller than `batch_size` is dropped."""
    order = torch.Generator().manual_seed(seed)
    loader = DataLoader(TensorDataset(X, y), batch_size=batch_size, shuffle=True,
                        drop_last=True, generator=order)
    for _ in range(epochs):
        yield from loader


@torch.no_grad()
def accuracy(model: nn.Module, X: Tensor = X_test, y: Tensor = y_test) -> float:
    """The fraction of `X` that `model` classifies as `y` (the test images by default),
    computed in evaluation mode; the model is left in training mode."""
    model.eval()
    acc = (model(X).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def mlp(*hidden: int) -> nn.Sequential:
    """A classifier of the 64 pixels: one linear layer and a ReLU per width in `hidden`
    (`fc1`, `relu1`, `fc2`, `relu2`, ...), then a linear head `out` to the 10 digits.
    Seeded: every call with the same widths starts from the same weights."""
    torch.manual_seed(0)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    n_in = 64
    for k, width in enumerate(hidden, start=1):
        layers[f"fc{k}"] = nn.Linear(n_in, width)
        layers[f"relu{k}"] = nn.ReLU()
        n_in = width
    layers["out"] = nn.Linear(n_in, 10)
    return nn.Sequential(layers)


def lesson_ok(claim: str) -> None:
    """Print the line a lesson's last cell ends with, once its asserts hold: the project's
    tests run each notebook and read this line."""
    print(f"LESSON OK: {claim}")
