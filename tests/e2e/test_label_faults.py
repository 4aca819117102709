"""Labels of one class, in real short trainings of a 5-class classifier: labels made as a
constant (from the first step, or overwritten from a later one) and data sorted by class
and not shuffled are an error naming the labels, dated from the first batch read of one
class; the training is the same bit for bit. Shuffled data stays quiet, and so do labels
that are not judged: two classes of very unequal sizes, a segmentation's pixels, a
contrastive loss whose positive is always first among thousands of candidates."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from loops import assert_no_errors
from torch import nn

import neuraldbg_nb as ndbg

CLASSES = 5


def _data(order: str = "shuffled") -> tuple[torch.Tensor, torch.Tensor]:
    """4000 samples of 5 classes (25 batches of 32 each), each class its own cluster:
    shuffled, or sorted by class."""
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(CLASSES, 16, generator=g) * 2
    y = torch.randint(0, CLASSES, (4000,), generator=g)
    x = centers[y] + torch.randn(4000, 16, generator=g)
    if order == "sorted":
        at = torch.argsort(y, stable=True)
        x, y = x[at], y[at]
    return x, y


def _train(x: torch.Tensor, y: torch.Tensor, steps: int = 60, constant_from: int | None = None,
           watched: bool = True) -> tuple[object, list[float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with ndbg.watch(model, report=False) if watched else _Plain() as run:
        for step in range(steps):
            at = slice(step * 32 % len(x), step * 32 % len(x) + 32)
            labels = y[at]
            if constant_from is not None and step >= constant_from:
                labels = torch.zeros_like(labels)  # a label column overwritten
            opt.zero_grad()
            loss = F.cross_entropy(model(x[at]), labels)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return run, losses


class _Plain:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _labels(run) -> list:
    return [e for e in run.events if e.kind == "data_anomaly" and e.signal == "labels"]


def test_constant_labels_are_the_first_failure_from_step_0_and_training_is_unchanged():
    """Every label 0: the model learns to answer 0 and its loss falls toward 0. An error
    at step 0, the first failure, saying which class and how many batches."""
    x, y = _data()
    run, losses = _train(x, y, constant_from=0)
    assert losses == _train(x, y, constant_from=0, watched=False)[1]
    first = run.first_failure
    assert (first.kind, first.signal, first.step, first.severity) == (
        "data_anomaly", "labels", 0, "error"), first
    assert "every label the loss was given is class 0 of 5" in first.message


def test_labels_overwritten_from_a_later_step_are_dated_there():
    """The label column overwritten from step 40 (a sampled step): the error is dated 40."""
    x, y = _data()
    run, _ = _train(x, y, steps=90, constant_from=40)
    (e,) = _labels(run)
    assert (e.step, e.severity) == (40, "error"), e
    assert run.first_failure == e


def test_data_sorted_by_class_is_an_error_that_says_to_shuffle():
    """Sorted by class and read in order: each batch holds one class, another one from
    stretch to stretch."""
    x, y = _data("sorted")
    run, _ = _train(x, y, steps=120)
    first = run.first_failure
    assert (first.kind, first.signal, first.step) == ("data_anomaly", "labels", 0), first
    assert "sorted by class and not shuffled" in first.message
    assert "shuffle=True" in first.message


def test_shuffled_labels_and_labels_not_judged_are_quiet():
    """Shuffled 5-class data; two classes, one of them 1% of the samples (one-class
    batches by chance); a segmentation whose pixels are all background; an InfoNCE loss
    whose positive is always class 0 of 4097 candidates."""
    x, y = _data()
    run, _ = _train(x, y)
    assert not _labels(run) and run.first_failure is None, run.events

    g = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    binary = nn.Linear(16, 2)
    opt = torch.optim.SGD(binary.parameters(), lr=0.01)
    with ndbg.watch(binary, report=False) as run:
        for _ in range(60):
            xb = torch.randn(32, 16, generator=g)
            yb = (torch.rand(32, generator=g) < 0.01).long()
            opt.zero_grad()
            F.cross_entropy(binary(xb), yb).backward()
            opt.step()
    assert not _labels(run), run.events

    seg = nn.Conv2d(3, 4, 3, padding=1)
    opt = torch.optim.SGD(seg.parameters(), lr=0.01)
    with ndbg.watch(seg, report=False) as run:
        for _ in range(40):
            opt.zero_grad()
            out = seg(torch.randn(8, 3, 10, 10, generator=g))
            F.cross_entropy(out, torch.zeros(8, 10, 10, dtype=torch.long)).backward()
            opt.step()
    assert not _labels(run), run.events

    encoder = nn.Linear(16, 32)
    queue = F.normalize(torch.randn(4096, 32, generator=g), dim=1)
    opt = torch.optim.SGD(encoder.parameters(), lr=0.01)
    with ndbg.watch(encoder, report=False) as run:
        for _ in range(40):
            xb = torch.randn(32, 16, generator=g)
            q = F.normalize(encoder(xb), dim=1)
            k = F.normalize(encoder(xb + 0.1 * torch.randn(32, 16, generator=g)), dim=1).detach()
            logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / 0.07
            opt.zero_grad()
            F.cross_entropy(logits, torch.zeros(32, dtype=torch.long)).backward()
            opt.step()
    assert not _labels(run), run.events
    assert_no_errors(run)
