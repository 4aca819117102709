"""The weight probe's slices (`Slices`): each weight's first elements in memory order,
copied per device and dtype in one op; their norms, moves and unchanged counts equal
what the slices give one by one."""

from __future__ import annotations

import torch

from neuraldbg_nb.record.reductions import Scalars
from neuraldbg_nb.record.slices import Slices, flat_slice

SIZE = 64


def _weights() -> list[torch.Tensor]:
    torch.manual_seed(0)
    conv = torch.randn(8, 3, 3, 3).to(memory_format=torch.channels_last)
    gappy = torch.randn(10, 20)[:, ::2]  # memory with gaps: flattened at every copy
    return [torch.randn(16), torch.randn(5, 40), conv, torch.randn(16), gappy,
            torch.randn(3, 3, dtype=torch.float64), torch.randn(70).bfloat16()]


def _memory_order(w: torch.Tensor) -> torch.Tensor:
    if w.is_contiguous():
        return w
    p = w.permute(sorted(range(w.dim()), key=w.stride, reverse=True))
    return p if p.is_contiguous() else w


def _norm(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x.float() if x.element_size() < 4 else x))


def test_norms_moves_and_unchanged_counts_match_the_slices_one_by_one() -> None:
    weights = _weights()
    s = Slices(weights, SIZE)
    before = s.take()
    expect_before = [w.reshape(-1)[:SIZE].clone() for w in map(_memory_order, weights)]
    sc = Scalars()
    pos = s.norms(sc, before)
    v = sc.to_host()
    for p, x in zip(pos, expect_before, strict=True):
        assert abs(v[p] - _norm(x)) <= 1e-5 * max(1.0, _norm(x))

    with torch.no_grad():  # an update: every weight moves, the bf16 one only in part
        for w in weights:
            w.add_(0.5 if w.dtype != torch.bfloat16 else 0.0)
        weights[-1][:10].add_(1.0)
    s.keep()
    after = [w.reshape(-1)[:SIZE].clone() for w in map(_memory_order, weights)]
    pos = s.moved(sc, before)
    pos_unchanged, which, sizes = s.unchanged(sc, before)
    v = sc.to_host()
    for p, a, b in zip(pos, after, expect_before, strict=True):
        assert abs(v[p] - _norm(a - b)) <= 1e-5 * max(1.0, _norm(a - b))
    assert which == [len(weights) - 1] and sizes == [SIZE]
    assert v[pos_unchanged[0]] == SIZE - 10

    with torch.no_grad():  # edited outside the optimizer before the next forward
        weights[1].mul_(3.0)
    kept, moved = s.kept_and_moved(sc)
    v = sc.to_host()
    for i, (p, q, a) in enumerate(zip(kept, moved, after, strict=True)):
        assert abs(v[p] - _norm(a)) <= 1e-5 * max(1.0, _norm(a))
        now = _memory_order(weights[i]).reshape(-1)[:SIZE]
        assert abs(v[q] - _norm(now - a)) <= 1e-5 * max(1.0, _norm(now - a))
        assert (v[q] > 0) == (i == 1)


def test_a_channels_last_slice_is_a_view_in_memory_order_and_a_gappy_one_is_read_again() -> None:
    conv = torch.randn(4, 2, 3, 3).to(memory_format=torch.channels_last)
    view, again = flat_slice(conv, 10)
    assert not again and view.data_ptr() == conv.data_ptr()
    gappy = torch.randn(6, 6)[:, ::3]
    s = Slices([gappy], SIZE)
    s.keep()
    sc = Scalars()
    with torch.no_grad():
        gappy.mul_(2.0)
    _, moved = s.kept_and_moved(sc)
    assert sc.to_host()[moved[0]] > 0, "a weight whose memory has gaps is followed too"
