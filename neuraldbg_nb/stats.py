"""Device-side summaries: cheap reductions that stay on the tensor's device.

Every function here returns 0-d tensors and never reads an accelerator's value on the
host: a step's summaries are collected in a `Scalars` batch and reach the host in one
transfer per device. (Values on the CPU, `HOST_DEVICES`, are read at once where that
saves a pass: `known_finite`.) The cheap path (every step) is one `torch.aminmax` per
activation, or `amax` where it cannot be negative (taken in the probe's hook), which also
flags non-finite values for free (a NaN or Inf anywhere makes min or max non-finite). The
rich path (sampled steps) adds sums, zero and non-finite counts, dead units and
saturation.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import torch


class Scalars:
    """Device values gathered during a step, moved to the host together.

    Values come in chunks: a single 0-d tensor (`add`) or a list stacked into one tensor
    (`extend`), so a step with hundreds of layers holds tens of chunks, not hundreds of
    tensors, and `to_host` does no per-value Python work.
    """

    def __init__(self) -> None:
        self._chunks: list[tuple[int, torch.Tensor]] = []  # (first position, 1-d values)
        self._n = 0

    def add(self, t: torch.Tensor) -> int:
        """One value (a 0-d or one-element tensor); its position in `to_host`'s array."""
        self._chunks.append((self._n, t.reshape(1)))
        self._n += 1
        return self._n - 1

    def extend(self, ts: list[torch.Tensor]) -> int:
        """Values of 0-d tensors, stacked in one op; the first position (the others
        follow in order)."""
        start = self._n
        if len({t.device for t in ts}) > 1:  # model parallel: one chunk per value
            for t in ts:
                self.add(t)
        elif ts:
            self._chunks.append((start, torch.stack(ts)))
            self._n += len(ts)
        return start

    def add_row(self, values: torch.Tensor) -> int:
        """Values of a 1-d tensor; the first position (the others follow in order)."""
        start = self._n
        self._chunks.append((start, values))
        self._n += values.numel()
        return start

    def __len__(self) -> int:
        return self._n

    def to_host(self) -> np.ndarray:
        """All values as float64, in the order added; one device-to-host copy per device."""
        out = np.empty(self._n, np.float64)
        by_device: dict[torch.device, dict[torch.dtype, list[tuple[int, torch.Tensor]]]] = \
            defaultdict(lambda: defaultdict(list))
        for start, chunk in self._chunks:
            by_device[chunk.device][chunk.dtype].append((start, chunk))
        for device, by_dtype in by_device.items():
            wide = torch.float32 if device.type == "mps" else torch.float64
            parts: list[torch.Tensor] = []
            starts: list[int] = []
            sizes: list[int] = []
            for chunks in by_dtype.values():
                parts.append(torch.cat([c for _, c in chunks]).to(wide))
                starts.extend(s for s, _ in chunks)
                sizes.extend(len(c) for _, c in chunks)
            # where each value goes: its chunk's start plus its place in the chunk
            n = np.asarray(sizes)
            order = np.repeat(np.asarray(starts) - (np.cumsum(n) - n), n) + np.arange(n.sum())
            out[order] = torch.cat(parts).cpu().numpy()
        self._chunks.clear()
        self._n = 0
        return out


FRACTION_SAMPLE = 65536
"""Elements read for the zero and saturated fractions: all of them up to this size, an
evenly strided sample of this many above it (counting compares costs 10-20 times a sum on
the CPU; a fraction read from 65536 elements is within 0.5% of the whole)."""


def _fraction_sample(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    if n <= FRACTION_SAMPLE or not x.is_contiguous():
        return x
    return x.view(-1)[::-(-n // FRACTION_SAMPLE)]


def rich_activation(x: torch.Tensor, role: str, bounds: tuple[float, float] | None,
                    into: Scalars, finite: bool = False, nonneg: bool = False
                    ) -> tuple[int, int, int, int, int, int, int, int]:
    """Positions of (sum, norm, zero count, non-finite count, dead units, saturated
    count), -1 where not applicable, then the number of units and the number of elements
    the zero and saturated counts were taken over (both known on the host).

    finite: the caller knows every value is finite (its min and max are, read on the
    host): the non-finite count is then 0 (position -1) without a counting pass, the
    costliest of these reductions on the CPU (it allocates a tensor the size of x), and
    the zeros are counted from signs. nonneg: no value is below zero (a ReLU's output)."""
    f32 = torch.float32
    xs = _fraction_sample(x)
    p_sum = into.add(x.sum(dtype=f32))
    p_norm = into.add(torch.linalg.vector_norm(x, dtype=f32))
    if finite and xs.numel() < 2**24:  # |sign| is 0 or 1: summed (exactly in float32),
        nonzero = (xs if nonneg else xs.abs()).sign().sum(dtype=f32)  # 3-5x faster than == 0
        p_zero = into.add(xs.numel() - nonzero)
    else:  # a NaN's sign is NaN
        p_zero = into.add((xs == 0).sum())
    # x - x: 0 where finite, NaN elsewhere
    p_bad = -1 if finite else into.add(torch.count_nonzero(x - x))
    p_dead = p_sat = -1
    units = 0
    if role == "relu" and x.dim() >= 2:
        # units: features of (N, F) and (N, T, F), channels of (N, C, ...)
        unit_dim = x.dim() - 1 if x.dim() in (2, 3) else 1
        dims = [d for d in range(x.dim()) if d != unit_dim]
        p_dead = into.add((x.amax(dim=dims) <= 0).sum())
        units = x.shape[unit_dim]
    if bounds is not None:
        lo, hi = bounds
        center, half = (lo + hi) / 2, (hi - lo) / 2
        p_sat = into.add(((xs - center).abs() >= 0.98 * half).sum())
    return p_sum, p_norm, p_zero, p_bad, p_dead, p_sat, units, xs.numel()


def input_batch(x: torch.Tensor, rich: bool, into: Scalars) -> dict[str, int]:
    """Positions of a batch's summaries. Every step: min, max (a free non-finite flag),
    sum and a strided sum (with min and max, a fingerprint that tells an exact repeat of
    the previous batch). Sampled steps add the norm, nonzero and finite counts; the finite
    count is -1 (all of them) where a CPU batch's min and max are finite."""
    xf = x if x.is_floating_point() else x.float()
    mn, mx = torch.aminmax(xf)
    pos = {"min": into.add(mn), "max": into.add(mx),
           "sum": into.add(xf.sum(dtype=torch.float32)),
           "print": into.add(xf.reshape(-1)[1::3].sum(dtype=torch.float32))}
    if rich:
        pos["norm"] = into.add(torch.linalg.vector_norm(xf, dtype=torch.float32))
        pos["nonzero"] = into.add(torch.count_nonzero(xf))
        pos["finite"] = -1 if known_finite(mn, mx) else into.add(torch.isfinite(xf).sum())
    return pos


HOST_DEVICES = frozenset({"cpu"})
"""Device types whose values the host reads without a transfer (or a sync). The probe
reads a few of them at once where that saves work; on any other device it never does.
Tests empty it to run the accelerator code path on the CPU."""


def on_host(t: torch.Tensor) -> bool:
    """True if `t`'s values can be read without a transfer (see `HOST_DEVICES`)."""
    return t.device.type in HOST_DEVICES


def known_finite(mn: torch.Tensor, mx: torch.Tensor) -> bool:
    """True if min and max are host values and finite (then every value is); False when
    they are not, or live on an accelerator, where reading them would cost a sync."""
    return on_host(mn) and math.isfinite(float(mn)) and math.isfinite(float(mx))


def grouped_norms(tensors: list[torch.Tensor], into: Scalars) -> list[int]:
    """Norm of each tensor, fused per (device, dtype) with `torch._foreach_norm`."""
    groups: dict[tuple[torch.device, torch.dtype, bool], list[int]] = defaultdict(list)
    for i, t in enumerate(tensors):
        groups[(t.device, t.dtype, t.is_sparse)].append(i)
    pos = [0] * len(tensors)
    for idx in groups.values():
        dense = [tensors[i] for i in idx]
        if dense[0].is_sparse:
            norms = [torch.linalg.vector_norm(t.coalesce().values()) for t in dense]
        else:  # half-precision norms overflow at 65504: accumulate in float32
            wide = torch.float32 if dense[0].element_size() < 4 else None
            norms = list(torch._foreach_norm(dense, 2, dtype=wide))
        start = into.extend(norms)
        for k, i in enumerate(idx):
            pos[i] = start + k
    return pos


StackPlan = list[tuple[list[int], list[torch.Tensor]]]
"""Tensors grouped by (device, dtype, shape): (their indices, the tensors)."""
Stacks = list[tuple[list[int], torch.Tensor]]
"""The same groups copied into (k, numel) matrices: (indices, rows)."""


def stack_plan(tensors: list[torch.Tensor]) -> StackPlan:
    """`tensors` grouped by (device, dtype, shape) for `stacked`; worth keeping while the
    tensors are (grouping costs a few microseconds per tensor)."""
    groups: dict[tuple[torch.device, torch.dtype, torch.Size], list[int]] = defaultdict(list)
    for i, t in enumerate(tensors):
        groups[(t.device, t.dtype, t.shape)].append(i)
    return [(idx, [tensors[i] for i in idx]) for idx in groups.values()]


def stacked(plan: StackPlan) -> Stacks:
    """Copies of small tensors (the weight probe's slices) in one stack per shape: a copy
    of hundreds of them is a few ops, and so are their norms and differences later."""
    return [(idx, torch.stack(views).reshape(len(views), -1)) for idx, views in plan]


def stacked_norms(stacks: Stacks, into: Scalars) -> list[int]:
    """Positions of the norm of each tensor in `stacks`, in the order of their indices."""
    pos = [0] * sum(len(idx) for idx, _ in stacks)
    for idx, rows in stacks:
        wide = torch.float32 if rows.element_size() < 4 else None  # as in grouped_norms
        start = into.add_row(torch.linalg.vector_norm(rows, dim=1, dtype=wide))
        for k, i in enumerate(idx):
            pos[i] = start + k
    return pos
