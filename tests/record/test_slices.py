"""The weight probe's slices (`Slices`): each weight's first elements in memory order,
copied per device and dtype in one op; their norms, moves and unchanged counts equal
what the slices give one by one."""

from __future__ import annotations

import math

import pytest
import torch

from neuraldbg_nb.record.reductions import STACKED, Scalars
from neuraldbg_nb.record.slices import Slices, flat_slice
from neuraldbg_nb.record.weights import EditCheck

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
    kept, totals = s.kept_and_edit_totals(sc)
    v = sc.to_host()
    moved, heads = s.edit_norms(sc)
    w = sc.to_host()
    for i, (p, q, h, a) in enumerate(zip(kept, moved, heads, after, strict=True)):
        assert abs(v[p] - _norm(a)) <= 1e-5 * max(1.0, _norm(a))
        # the edit check reads the whole slice by default
        assert abs(w[h] - v[p]) <= 1e-5 * max(1.0, v[p])
        now = _memory_order(weights[i]).reshape(-1)[:SIZE]
        assert abs(w[q] - _norm(now - a)) <= 1e-5 * max(1.0, _norm(now - a))
        assert (w[q] > 0) == (i == 1)
    # per group (device and dtype): the moved total is >0 only in the edited weight's
    assert [v[m] > 0 for m in totals[::2]] == [True, False, False]


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
    _, totals = s.kept_and_edit_totals(sc)
    assert sc.to_host()[totals[0]] > 0, "a weight whose memory has gaps is followed too"


def test_slices_of_one_length_normed_together_and_lone_ones_normed_alike() -> None:
    """Slices of one length, `STACKED` or more of them, are normed in one op over their
    2-D view, the others in one `_foreach_norm`: each norm still lands where its weight's
    position says. The edit check reads each slice's first `edit` elements."""
    torch.manual_seed(1)
    weights = [torch.randn(8, 16) for _ in range(STACKED + 1)] + [torch.randn(7),
                                                                  torch.randn(5, 3)]
    weights.insert(2, torch.randn(9))
    edit = 8
    first = [w.reshape(-1)[:SIZE].clone() for w in weights]
    s = Slices(weights, SIZE, edit)
    before = s.take()
    sc = Scalars()
    pos = s.norms(sc, before)
    with torch.no_grad():
        for k, w in enumerate(weights):
            w.add_(0.1 * (k + 1))
    after = [w.reshape(-1)[:SIZE].clone() for w in weights]
    s.keep()
    moved = s.moved(sc, before)
    with torch.no_grad():
        weights[3].mul_(2.0)
        weights[0].reshape(-1)[edit:].add_(1.0)  # beyond what the edit check reads
    kept, _ = s.kept_and_edit_totals(sc)
    edited, heads = s.edit_norms(sc)
    v = sc.to_host()
    for i, w in enumerate(weights):
        now = w.reshape(-1)[:edit]
        for p, x in ((pos[i], first[i]), (moved[i], after[i] - first[i]),
                     (kept[i], after[i]), (edited[i], now - after[i][:edit]),
                     (heads[i], after[i][:edit])):
            assert abs(v[p] - _norm(x)) <= 1e-5 * max(1.0, _norm(x)), i
    assert [v[p] > 0 for p in edited] == [i == 3 for i in range(len(weights))]


def test_the_edit_totals_are_zero_exactly_where_no_slice_moved() -> None:
    """`w_edited` is read per slice only where some slice moved: the totals over all
    slices must say so exactly (0 where nothing moved, whatever the weights' sizes; a
    move of one element a million times smaller than the weight's is seen), and the
    factors read either way must be those of the slices one by one."""
    torch.manual_seed(2)
    weights = [torch.randn(8, 16) for _ in range(STACKED + 1)] + [
        torch.randn(7), torch.randn(300) * 1e-20, torch.randn(5, 3, dtype=torch.float64)]
    s = Slices(weights, SIZE, 8)
    s.keep()
    n = len(weights) + 1  # the last layer has no weights: NaN
    sc = Scalars()
    _, totals = s.kept_and_edit_totals(sc)
    v = sc.to_host()
    assert [v[m] for m in totals[::2]] == [0.0, 0.0]  # two groups: float32, float64
    assert all(math.isfinite(v[h]) for h in totals[1::2])
    quiet = EditCheck(s, list(range(len(weights))), totals).factors(v, sc, n)
    assert quiet[:-1] == [0.0] * len(weights) and math.isnan(quiet[-1])

    head = weights[3].reshape(-1)[:8].clone()
    with torch.no_grad():
        weights[3][0, 0] += 1e-6
    _, totals = s.kept_and_edit_totals(sc)
    v = sc.to_host()
    assert v[totals[0]] > 0 and v[totals[2]] == 0.0
    got = EditCheck(s, list(range(len(weights))), totals).factors(v, sc, n)
    moved = float(weights[3][0, 0] - head[0])  # 1e-6 as float32 rounds it
    assert got[3] == pytest.approx(moved / float(torch.linalg.vector_norm(head)), rel=1e-4)
    assert [g for i, g in enumerate(got[:-1]) if i != 3] == [0.0] * (len(weights) - 1)
