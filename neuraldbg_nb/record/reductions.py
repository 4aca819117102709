"""Device-side summaries: cheap reductions that stay on the tensor's device.

Every function here returns 0-d tensors and never reads an accelerator's value on the
host: a step's summaries are collected in a `Scalars` batch and reach the host in one
transfer per device. (Values on the CPU, `HOST_DEVICES`, are read at once where that
saves a pass: `known_finite`.) The cheap path (every step) is one `min_max` per
activation, or `amax` where it cannot be negative (taken in the probe's hook), which also
flags non-finite values for free (a NaN or Inf anywhere makes min or max non-finite). The
rich path (sampled steps) adds sums, zero and non-finite counts, dead units and
saturation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch


class Scalars:
    """Device values gathered during a step, moved to the host together.

    Values come in chunks: a single 0-d tensor (`add`) or a list stacked into one tensor
    (`extend`), so a step with hundreds of layers holds tens of chunks, not hundreds of
    tensors, and `to_host` does no per-value Python work. Norms of whole tensors asked
    for by several parts of a step (`norms`: the gradients', the weight slices') are taken
    together as the values go to the host, one `_foreach_norm` per device and dtype.
    """

    def __init__(self) -> None:
        # (first position, 1-d values; None until `_take_norms` fills it)
        self._chunks: list[tuple[int, torch.Tensor | None]] = []
        self._later: dict[tuple[torch.device, torch.dtype, torch.dtype | None],
                          list[tuple[int, list[torch.Tensor]]]] = {}
        self._n = 0
        self.from_device = False
        """Whether the last `to_host` read an accelerator's values: it waited for the
        device work queued before it, mostly the training's (`selfcost`)."""

    def add(self, t: torch.Tensor) -> int:
        """One value (a 0-d or one-element tensor); its position in `to_host`'s list."""
        self._chunks.append((self._n, t.reshape(1)))
        self._n += 1
        return self._n - 1

    def extend(self, ts: list[torch.Tensor], one_device: bool = False) -> int:
        """Values of 0-d tensors, stacked in one op; the first position (the others
        follow in order). `one_device`: the caller knows they share a device (one
        `_foreach_*` op made them), which saves asking each one."""
        start = self._n
        if not one_device and len({t.device for t in ts}) > 1:
            for t in ts:  # model parallel: one chunk per value
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

    def norms(self, ts: list[torch.Tensor], dtype: torch.dtype | None = None) -> int:
        """The 2-norms of `ts` (tensors of one device and dtype, taken in `dtype` where
        given); the first position (the others follow in order). They are read when the
        values go to the host (`to_host`), so the tensors must keep their values until
        then; there every norm asked for on a device and dtype is taken in one
        `_foreach_norm` and one stack: on the CPU each call costs several microseconds
        before its first tensor, right after a training step."""
        start = self._n
        if not ts:
            return start
        key = (ts[0].device, ts[0].dtype, dtype)
        self._later.setdefault(key, []).append((len(self._chunks), ts))
        self._chunks.append((start, None))
        self._n += len(ts)
        return start

    def _take_norms(self) -> None:
        """The norms of `norms`, into their chunks."""
        for (_, _, dtype), parts in self._later.items():
            got = torch.stack(torch._foreach_norm([t for _, ts in parts for t in ts], 2,
                                                  dtype=dtype))
            at = 0
            for i, ts in parts:
                self._chunks[i] = (self._chunks[i][0], got[at:at + len(ts)])
                at += len(ts)
        self._later.clear()

    def __len__(self) -> int:
        return self._n

    def to_host(self) -> list[float]:
        """All values as Python floats, in the order added; one device-to-host copy per
        device. A list, not an array: the step row reads a few dozen of them right after
        a training step, when each numpy call pays a cold start (`step_row`)."""
        if self._later:
            self._take_norms()
        chunks = [c for _, c in self._chunks if c is not None]
        assert len(chunks) == len(self._chunks)  # (`_take_norms` filled every one)
        if chunks and all(c.device == chunks[0].device and c.dtype == chunks[0].dtype
                          for c in chunks):  # the usual step: one join, already in order
            self.from_device = not on_host(chunks[0])
            out = torch.cat(chunks).tolist()  # exact: any float dtype's values are floats
        else:
            self.from_device = any(not on_host(c) for c in chunks)
            out = self._gathered()
        self._chunks.clear()
        self._n = 0
        return out

    def _gathered(self) -> list[float]:
        """`to_host`'s values for chunks of several devices or dtypes (a sampled step's
        counts are integers): joined per device, each dtype widened first (float32 would
        round counts above 2**24), and put in place by slices of a list (numpy indexing
        takes about twice as long for a sampled step's transfer)."""
        out = [0.0] * self._n
        by_device: dict[torch.device, dict[torch.dtype, list[tuple[int, torch.Tensor]]]] = \
            defaultdict(lambda: defaultdict(list))
        for start, chunk in self._chunks:
            if chunk is not None:  # (filled by `_take_norms`)
                by_device[chunk.device][chunk.dtype].append((start, chunk))
        for by_dtype in by_device.values():
            parts = [torch.cat([c for _, c in chunks]).to(_wide(chunks[0][1]))
                     for chunks in by_dtype.values()]
            got = torch.cat(parts).tolist()
            i = 0
            for chunks in by_dtype.values():  # in the order joined
                for start, c in chunks:
                    k = len(c)
                    out[start:start + k] = got[i:i + k]
                    i += k
        return out


def acc_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a tensor's sums and norms are taken in: float32 (half precision overflows
    at 65504), float64 for float64 tensors (`vector_norm` refuses to narrow them, which
    would stop the watch of a float64 model at its first step)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _wide(t: torch.Tensor) -> torch.dtype:
    """The dtype values travel to the host in: float64, or float32 on MPS (no float64)."""
    return torch.float32 if t.is_mps else torch.float64


SAMPLE = 16384
"""Elements read for the statistics that a sample gives well: the zero and saturated
fractions of any activation, and on the CPU also the mean and std of one too large to be
batched (`sample_of`); all of them up to this size. Counting compares costs several times
a sum on the CPU, and an evenly strided sample of 16384 elements gives a fraction within
0.5% of the whole. What detection judges exactly (the extremes, non-finite values, dead
units) is read from every element."""


def _stride(n: int) -> int:
    """The stride of an evenly strided sample of at most `SAMPLE` of `n` elements: odd, so
    that it walks across the dimensions of a tensor, whose sizes are mostly powers of two,
    instead of landing on the same column (the left edge of every feature map) each time."""
    return -(-n // SAMPLE) | 1


def _fraction_sample(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    if n <= SAMPLE or not x.is_contiguous():
        return x
    return x.view(-1)[::_stride(n)]


def sample_of(x: torch.Tensor) -> torch.Tensor | None:
    """An evenly strided sample of at most `SAMPLE` of `x`'s elements, in its memory order
    (`dense`), as a 1-D view; None where its memory has gaps (`sampled_activation`)."""
    flat = dense(x)
    if flat is None:
        return None
    return flat.view(-1)[::_stride(flat.numel())]


def dead_units(x: torch.Tensor, role: str, into: Scalars) -> tuple[int, int]:
    """Position in `into` of how many of `x`'s units are dead (at most 0 over the whole
    batch: read from every element), and its number of units; (-1, 0) where not judged (a
    layer not ReLU-like, too few values per unit: `dead_judged`)."""
    if role != "relu" or not dead_judged(x.shape):
        return -1, 0
    return into.add(_dead(x, 0).sum(dtype=torch.float32)), x.shape[_unit_dim(x.dim())]


EXACT_COUNT = 1 << 24
"""Counts up to this are exact in float32: summed in it, a step's counts share its sums'
dtype and go to the host in the same join (`Scalars.to_host`)."""


def nonzero_count(x: torch.Tensor, finite: bool) -> torch.Tensor:
    """How many of `x`'s elements are not zero. Where they are known finite (`finite`),
    from summed signs in float32 (`EXACT_COUNT`): `torch.count_nonzero` takes five times
    as long on the CPU from 65536 elements on; else an integer count."""
    if finite and x.numel() <= EXACT_COUNT:
        return _signs(x, False).sum(dtype=torch.float32)
    return torch.count_nonzero(x)


def rich_activation(x: torch.Tensor, role: str, bounds: tuple[float, float] | None,
                    into: Scalars, finite: bool = False, nonneg: bool = False
                    ) -> tuple[int, int, int, int, int, int, int, int]:
    """Positions of (sum, norm, zero count, non-finite count, dead units, saturated
    count), -1 where not applicable, then the number of units and the number of elements
    the zero and saturated counts were taken over (both known on the host).

    finite: the caller knows every value is finite (its min and max are, read on the
    host): the non-finite count is then 0 (position -1) without a counting pass, the
    costliest of these reductions on the CPU (it allocates a tensor the size of x), and
    the zeros are counted from signs. nonneg: no value is below zero (a ReLU's output).
    Counts are summed in float32 (`EXACT_COUNT`: a sample, or one per unit); the
    non-finite count, of every element, is an integer."""
    f32, acc = torch.float32, acc_dtype(x)
    flat = dense(x)  # the whole-tensor reductions read memory order (channels-last...)
    flat = x if flat is None else flat
    xs = _fraction_sample(flat)
    p_sum = into.add(flat.sum(dtype=acc))
    p_norm = into.add(torch.linalg.vector_norm(flat, dtype=acc))
    count = f32 if xs.numel() <= EXACT_COUNT else torch.int64  # (gaps: no sample, all of it)
    if finite:  # summed signs: 3-5x faster than == 0
        p_zero = into.add(xs.numel() - _signs(xs, nonneg).sum(dtype=count))
    else:  # a NaN's sign is NaN
        p_zero = into.add((xs == 0).sum(dtype=count))
    # x - x: 0 where finite, NaN elsewhere
    p_bad = -1 if finite else into.add(torch.count_nonzero(flat - flat))
    p_dead, units = dead_units(x, role, into)
    p_sat = -1 if bounds is None else into.add(_pinned(xs, bounds).sum(dtype=count))
    return p_sum, p_norm, p_zero, p_bad, p_dead, p_sat, units, xs.numel()


def sampled_activation(x: torch.Tensor, role: str, bounds: tuple[float, float] | None,
                       into: Scalars, nonneg: bool = False) -> tuple[int, ...] | None:
    """The rich statistics of a large CPU activation whose values are known finite: the
    sums, zeros and saturation of its sample (`sample_of`), its dead units from every
    element (`dead_units`); None where it has no sample (memory with gaps). As
    `rich_activation`'s positions, after the number of elements the sums were taken over.
    The mean and std are shown, not judged: from 16384 elements they are within about 1%
    of the whole's, where the whole's sums and counts take four passes of 20-50 us each
    over a notebook conv net's feature maps."""
    part = sample_of(x)
    if part is None:
        return None
    # gathered once, the sample's passes read memory in order (1-D: no dead units there)
    p_sum, p_norm, p_zero, p_bad, _, p_sat, _, counted = rich_activation(
        part.contiguous(), role, bounds, into, finite=True, nonneg=nonneg)
    p_dead, units = dead_units(x, role, into)
    return counted, p_sum, p_norm, p_zero, p_bad, p_dead, p_sat, units, counted


BATCH_BYTES = 16 << 20
"""Memory for `RichBatch`'s row buffers, kept between sampled steps (a 100-layer model of
width 128 with batch 128 needs 13 MB); activations that do not fit take the per-layer
path."""

BATCH_ROW_BYTES = 64 << 10
"""Activations up to this size are batched by `RichBatch`: below it the fixed cost of an
op outweighs the reading; above it the per-layer path (a sample's, `sampled_activation`)
is as fast."""

CHUNK_BYTES = 1 << 20
"""Rows read together by `RichBatch.reduce`: their temporaries fit a core's L2 cache (a
100-layer MLP's rows read a third faster than at 512 KB, where the ops' fixed cost
weighed more)."""


class RichBatch:
    """The rich statistics of many small CPU activations in a few ops.

    On the CPU each op has a fixed cost of several microseconds, so the ten or so
    reductions of `rich_activation` cost a 100-layer model of small layers far more than
    the numbers they read. Here each activation is copied, in its hook, into a row of a
    buffer of its shape (one op, and safe against in-place edits later in the forward),
    and each buffer's statistics are taken once for all its rows when the step closes
    (`reduce`). Only activations whose values are known finite on the host, of at most
    `BATCH_ROW_BYTES`, are batched (all their elements are counted, as in
    `rich_activation` at that size); the caller takes the per-layer path for the others
    (`sampled_activation` for larger ones).
    """

    def __init__(self, max_bytes: int = BATCH_BYTES) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        # (shape, dtype, role, bounds, nonneg) -> [buffer, rows used]
        self._groups: dict[tuple[Any, ...], list[Any]] = {}

    def add(self, x: torch.Tensor, role: str, bounds: tuple[float, float] | None,
            nonneg: bool) -> tuple[tuple[Any, ...], int] | None:
        """Copy `x` into a row; its (group, row), or None where there is no room."""
        key = (x.shape, x.dtype, role, bounds, nonneg)
        group = self._groups.get(key)
        if group is None or group[1] == len(group[0]):
            if not self._grow(key, x, group):
                return None
            group = self._groups[key]
        row = group[1]
        group[0][row].copy_(x)
        group[1] = row + 1
        return key, row

    def _grow(self, key: tuple[Any, ...], x: torch.Tensor, group: list[Any] | None) -> bool:
        have = 0 if group is None else len(group[0])
        old = 0 if group is None else group[0].numel() * group[0].element_size()
        row_bytes = x.numel() * x.element_size()
        rows = min(max(8, 2 * have), (self.max_bytes - self.nbytes + old) // row_bytes)
        if rows <= have:
            return False
        size = rows * row_bytes
        buf = _rows_like(rows, x)
        if group is not None:
            buf[: group[1]].copy_(group[0][: group[1]])
        self._groups[key] = [buf, 0 if group is None else group[1]]
        self.nbytes += size - old
        return True

    def reduce(self, into: Scalars) -> dict[tuple[Any, ...], tuple[int, ...]]:
        """Per group, what `rich_activation` gives for one activation, for its first
        row: positions in `into` (row r's at first + r; -1 where not applicable, the
        non-finite count always), the units and the elements counted. Rows are read
        `CHUNK_BYTES` at a time, so that the temporaries stay in cache. Groups unused
        since the last reduce are freed (a shape that came once, such as a short last
        batch)."""
        out: dict[tuple[Any, ...], tuple[int, ...]] = {}
        for key, (buf, n) in list(self._groups.items()):
            if n == 0:
                del self._groups[key]
                self.nbytes -= buf.numel() * buf.element_size()
                continue
            shape, _, role, bounds, nonneg = key
            step = max(1, CHUNK_BYTES // (buf[0].numel() * buf.element_size()))
            parts = [_row_stats(buf[i:min(i + step, n)], role, bounds, nonneg)
                     for i in range(0, n, step)]
            p_sum, p_norm, p_zero, p_dead, p_sat = (
                into.add_row(torch.cat(col)) if col[0] is not None else -1
                for col in zip(*parts))
            units = shape[_unit_dim(len(shape))] if p_dead >= 0 else 0
            out[key] = (p_sum, p_norm, p_zero, -1, p_dead, p_sat, units, buf[0].numel())
            self._groups[key][1] = 0
        return out

    def clear(self) -> None:
        """Forget the rows of a step that will not be reduced (buffers are kept)."""
        for group in self._groups.values():
            group[1] = 0

    def release(self) -> None:
        """Free every buffer (the watch ended)."""
        self._groups.clear()
        self.nbytes = 0


def _row_stats(v: torch.Tensor, role: str, bounds: tuple[float, float] | None, nonneg: bool
               ) -> tuple[torch.Tensor | None, ...]:
    """`rich_activation`'s sums, norms, zero counts, dead units and saturated counts of
    each row of `v` (finite values, every element counted), None where not applicable."""
    f32, acc = torch.float32, acc_dtype(v)
    flat = v.reshape(len(v), -1)
    numel = flat.shape[1]
    zeros = numel - _signs(flat, nonneg).sum(1, dtype=f32)
    dead = _dead(v, 1).sum(1, dtype=f32) if role == "relu" and dead_judged(v.shape[1:]) \
        else None
    sat = _pinned(flat, bounds).sum(1, dtype=f32) if bounds is not None else None
    return (flat.sum(1, dtype=acc), torch.linalg.vector_norm(flat, dim=1, dtype=acc), zeros,
            dead, sat)


def _unit_dim(ndim: int) -> int:
    """The units of an activation, for dead units: the features of (N, F) and (N, T, F),
    the channels of (N, C, ...)."""
    return ndim - 1 if ndim in (2, 3) else 1


def _signs(x: torch.Tensor, nonneg: bool) -> torch.Tensor:
    """1 where a finite value is not zero, 0 where it is: summed, a nonzero count."""
    return (x if nonneg else x.abs()).sign()


DEAD_MIN_VALUES = 4
"""A unit is judged dead over at least this many of its values (rows of the batch,
positions of a sequence, pixels of a feature map). One sample zeroes about half of a ReLU
layer's units by chance: an online (batch size 1) MLP would read 55% dead from step 0,
where none of its units is dead over a thousand samples."""


def dead_judged(shape: torch.Size) -> bool:
    """Whether an activation of `shape` has enough values per unit (`DEAD_MIN_VALUES`) for
    its dead units to be counted."""
    if len(shape) < 2:
        return False
    units = shape[_unit_dim(len(shape))]
    return math.prod(shape) >= DEAD_MIN_VALUES * units


def _dead(x: torch.Tensor, first: int) -> torch.Tensor:
    """Per unit of the activation(s) in `x` from axis `first` on (0: one activation,
    1: rows of them), whether it is at most 0 for the whole batch."""
    unit = first + _unit_dim(x.dim() - first)
    return x.amax(dim=[d for d in range(first, x.dim()) if d != unit]) <= 0


def _pinned(x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """Per value, whether it lies at a bound of a bounded activation (within 2% of its
    half-range): saturated."""
    lo, hi = bounds
    center, half = (lo + hi) / 2, (hi - lo) / 2
    return (x - center).abs() >= 0.98 * half


def stored_values(x: torch.Tensor) -> torch.Tensor:
    """The values a sparse (or other non-strided) tensor holds, as a 1-d tensor, with one
    zero added where it has implicit zeros: what its extremes, sums and non-finite values
    are read from. PyTorch's reductions do not run on sparse layouts, and a dense copy of
    a large sparse tensor could be far larger than the tensor."""
    if x.is_sparse:
        v = x.coalesce().values()
    elif x.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        v = x.values()
    else:  # e.g. mkldnn: no stored values to read
        return x.to_dense().reshape(-1)
    v = v.reshape(-1)
    return torch.cat([v, v.new_zeros(1)]) if v.numel() < x.numel() else v


def dense(x: torch.Tensor) -> torch.Tensor | None:
    """`x` where it is contiguous; else the permutation of its dimensions that is
    contiguous (the memory order of a channels-last or transposed tensor); None where its
    memory has gaps or overlaps (a slice, an expanded view). Reductions over all elements
    give the same result on either, and PyTorch's are far faster on the contiguous one
    (`min_max`)."""
    if x.is_contiguous():
        return x
    p = x.permute(sorted(range(x.dim()), key=x.stride, reverse=True))
    return p if p.is_contiguous() else None


ONE_PASS_MIN_MAX = 32768
"""Up to this many elements, `min_max` takes `torch.aminmax`'s one pass: there the cost
is the call, not the reading (a 100-layer MLP's 8192-element outputs: 2.2 us against 3.8
us for amin and amax; even at 32768, 4.7 against 5.6 us; from 65536 on, the two win)."""


def min_max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of all of `x`, as `amin` and `amax`: two passes, but each of them
    vectorised, where `torch.aminmax`'s one pass is not: on the CPU aminmax takes about
    1.5 times as long as the two for a 1M-element conv output, and 1.4 times for a
    transformer's (16, 64, 192) output; small tensors take the one call
    (`ONE_PASS_MIN_MAX`). A tensor that is not contiguous is read in
    its memory order (`dense`): channels-last conv outputs, a multi-head attention's
    (seq, batch, dim) output seen batch first."""
    d = dense(x)
    flat = x if d is None else d
    if flat.numel() <= ONE_PASS_MIN_MAX:
        return torch.aminmax(flat)
    return flat.amin(), flat.amax()


HOST_DEVICES = frozenset({"cpu"})
"""Device types whose values the host reads without a transfer (or a sync). The probe
reads a few of them at once where that saves work; on any other device it never does.
Tests empty it to run the accelerator code path on the CPU."""


def on_host(t: torch.Tensor) -> bool:
    """True if `t`'s values can be read without a transfer (see `HOST_DEVICES`). Asked
    on every layer call: `is_cpu` is a flag, where `device` builds an object."""
    return ("cpu" in HOST_DEVICES) if t.is_cpu else (t.device.type in HOST_DEVICES)


def known_finite(mn: torch.Tensor, mx: torch.Tensor) -> bool:
    """True if min and max are host values and finite (then every value is); False when
    they are not, or live on an accelerator, where reading them would cost a sync."""
    return on_host(mn) and math.isfinite(float(mn)) and math.isfinite(float(mx))


SMALL_NORM = 4096
"""Tensors of up to this many elements (biases, norm layers' weights) are normed in stacks
of equal shape, `STACKED` or more of them: `_foreach_norm` on the CPU goes tensor by
tensor at about 3 us each, where a stack of a hundred biases and one norm of its rows
take 35 us in all."""

STACKED = 4
"""Tensors of one shape are normed as the rows of one stack (or one view) where there are
at least this many; fewer go with the rest into one `_foreach_norm`: right after a
training step each op costs several microseconds, and a small CNN's few biases and
norm-layer weights in stacks of two or three would pay two ops per stack."""


Group = tuple[str, list[int], "torch.dtype | None"]
"""One op of `grouped_norms`: its kind ("sparse", "stack" or "fused"), the indices of the
tensors it norms, and the dtype it accumulates in (None: the tensors' own)."""


class NormPlan:
    """`grouped_norms`' grouping of the tensors it was last given, kept while each keeps
    its shape, dtype, device and layout (a step's gradients, step after step): working it
    out costs about 2 us a tensor in Python, reading the key a third of that."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._groups: list[Group] = []

    def groups(self, tensors: list[torch.Tensor]) -> list[Group]:
        key = tuple((t.shape, t.dtype, t.device, t.layout) for t in tensors)
        if key != self._key:
            self._key, self._groups = key, _grouped(tensors)
        return self._groups


def grouped_norms(tensors: list[torch.Tensor], into: Scalars,
                  plan: NormPlan | None = None) -> list[int]:
    """Norm of each tensor: small ones in stacks of equal shape (`SMALL_NORM`), the rest
    fused per (device, dtype) with `torch._foreach_norm`. `plan`: the grouping kept from
    the last call, where the tensors are of the same kinds (`NormPlan`)."""
    pos = [0] * len(tensors)
    for kind, idx, wide in (plan.groups(tensors) if plan is not None else _grouped(tensors)):
        if kind == "sparse":
            start = into.extend([torch.linalg.vector_norm(tensors[i].coalesce().values())
                                 for i in idx])
        elif kind == "stack":
            rows = torch.stack([tensors[i] for i in idx]).reshape(len(idx), -1)
            start = into.add_row(torch.linalg.vector_norm(rows, dim=1, dtype=wide))
        else:
            start = into.norms([tensors[i] for i in idx], wide)
        _place(pos, idx, start)
    return pos


def _grouped(tensors: list[torch.Tensor]) -> list[Group]:
    """`grouped_norms`' ops for `tensors`: per (device, dtype, sparse), the sparse ones
    one by one, stacks of `STACKED` or more small ones of one shape, one fused op for the
    rest; half precision accumulated in float32 (its norms overflow at 65504)."""
    groups: dict[tuple[torch.device, torch.dtype, bool], list[int]] = defaultdict(list)
    for i, t in enumerate(tensors):
        groups[(t.device, t.dtype, t.is_sparse)].append(i)
    out: list[Group] = []
    for idx in groups.values():
        first = tensors[idx[0]]
        if first.is_sparse:
            out.append(("sparse", idx, None))
            continue
        wide = torch.float32 if first.element_size() < 4 else None
        by_shape: dict[torch.Size, list[int]] = defaultdict(list)
        rest: list[int] = []
        for i in idx:
            (by_shape[tensors[i].shape] if tensors[i].numel() <= SMALL_NORM else rest).append(i)
        for same in by_shape.values():
            if len(same) < STACKED:
                rest.extend(same)
            else:
                out.append(("stack", same, wide))
        if rest:
            out.append(("fused", rest, wide))
    return out


def _rows_like(rows: int, x: torch.Tensor) -> torch.Tensor:
    """An uninitialised buffer of `rows` tensors like `x`, kept from step to step. Made
    outside inference mode: made during an eval under `inference_mode` it would be an
    inference tensor, which cannot be written to after it."""
    with torch.inference_mode(False):
        return torch.empty((rows, *x.shape), dtype=x.dtype, device=x.device)


def _place(pos: list[int], idx: list[int], start: int) -> None:
    """Positions of consecutive values from `start`, for the tensors at `idx`."""
    for k, i in enumerate(idx):
        pos[i] = start + k


