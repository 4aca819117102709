"""Fixed slices of many weights, copied and normed in a few ops (`Slices`).

The weight probe reads a slice of every trained weight after each update and again
before the next one. On a notebook-sized model a step is a few milliseconds and each op
costs several microseconds right after the training's own (cold caches), so the count of
ops is the cost: here the slices of all weights of one device and dtype are copied by one
`torch.cat` into one flat buffer, and the norms of all slices of one length come from one
`vector_norm` over a 2-D view of it. A watch of a hundred layers pays about as many ops as
one of ten.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from .reductions import Scalars

Run = tuple[int, int, int]
"""Slices of one length, side by side in a flat buffer: (offset, how many, length)."""


def flat_slice(w: torch.Tensor, size: int) -> tuple[torch.Tensor, bool]:
    """The first `size` elements of `w` in its memory order, as a 1-D view where there is
    one (contiguous, channels-last, transposed), and whether it must be flattened again
    at every copy (a weight whose memory has gaps: its slice would otherwise be a copy
    taken once)."""
    if w.is_contiguous():
        return w.view(-1)[:size], False
    p = w.permute(sorted(range(w.dim()), key=w.stride, reverse=True))
    if p.is_contiguous():
        return p.reshape(-1)[:size], False
    return w, True


class _Group:
    """The slices of one (device, dtype): their sources in buffer order, where each
    slice lies in the flat buffer, and the buffer (row 0: the copy `keep` takes; row 1:
    room for the moves since)."""

    def __init__(self, sources: list[tuple[int, torch.Tensor, bool]], size: int) -> None:
        sources = sorted(sources, key=lambda s: -_length(s[1], s[2], size))  # runs by length
        self.index = [i for i, _, _ in sources]
        self._sources = [(t, again) for _, t, again in sources]
        self._again = any(again for _, again in self._sources)
        self._size = size
        self.runs: list[Run] = []
        self.where: list[tuple[int, int]] = []  # per slice, in buffer order: (run, place in it)
        offset = 0
        for _, t, again in sources:
            n = _length(t, again, size)
            if self.runs and self.runs[-1][2] == n:
                o, k, _ = self.runs[-1]
                self.runs[-1] = (o, k + 1, n)
            else:
                self.runs.append((offset, 1, n))
            self.where.append((len(self.runs) - 1, self.runs[-1][1] - 1))
            offset += n
        first = sources[0][1]
        # half-precision norms overflow at 65504: taken in float32
        self.wide = torch.float32 if first.element_size() < 4 else None
        with torch.inference_mode(False):  # written to at every step, also under inference
            self.buffer = torch.empty((2, offset), dtype=first.dtype, device=first.device)

    def parts(self) -> list[torch.Tensor]:
        """The slices' current values, as the views `torch.cat` reads."""
        if not self._again:
            return [t for t, _ in self._sources]
        return [t.reshape(-1)[:self._size] if again else t for t, again in self._sources]

    def rows(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """`flat` (one buffer's row, or a copy like it) as one (how many, length) matrix
        per run."""
        return [flat[o:o + k * n].view(k, n) for o, k, n in self.runs]


def _length(t: torch.Tensor, again: bool, size: int) -> int:
    return min(size, t.numel()) if again else t.numel()


class Slices:
    """The first `size` elements of each weight (`flat_slice`), grouped by device and
    dtype, with a copy as the last update left them (`keep`) to tell later what moved
    since. Positions handed back are in the order the weights were given."""

    def __init__(self, weights: list[torch.Tensor], size: int) -> None:
        by: dict[tuple[torch.device, torch.dtype], list[tuple[int, torch.Tensor, bool]]] = \
            defaultdict(list)
        for i, w in enumerate(weights):
            t, again = flat_slice(w, size)
            by[(w.device, w.dtype)].append((i, t, again))
        self._groups = [_Group(s, size) for s in by.values()]
        self._n = len(weights)
        self.kept = False
        """`keep` took a copy since the slices were made."""

    def __len__(self) -> int:
        return self._n

    def keep(self) -> None:
        """Copy the slices as they are now (after an update) into the buffers' row 0."""
        for g in self._groups:
            torch.cat(g.parts(), out=g.buffer[0])
        self.kept = True

    def take(self) -> list[torch.Tensor]:
        """A fresh copy of the slices, one flat tensor per group (before an update that
        is to be measured)."""
        return [torch.cat(g.parts()) for g in self._groups]

    def like(self, copy: list[torch.Tensor]) -> bool:
        """`copy` is a `take` of these slices."""
        return len(copy) == len(self._groups) and all(
            c.shape[0] == g.buffer.shape[1] for c, g in zip(copy, self._groups))

    def kept_norms(self, sc: Scalars) -> list[int]:
        """Positions on `sc` of the norms of the copy `keep` took."""
        return self._norms(sc, [g.buffer[0] for g in self._groups])

    def norms(self, sc: Scalars, copy: list[torch.Tensor]) -> list[int]:
        """Positions on `sc` of the norms of each slice in `copy` (a `take`)."""
        return self._norms(sc, copy)

    def moved(self, sc: Scalars, copy: list[torch.Tensor]) -> list[int]:
        """Positions on `sc` of the norms of what the kept copy differs from `copy` by
        (the update's move, where `copy` was taken before it)."""
        return self._norms(sc, [g.buffer[0] - c for g, c in zip(self._groups, copy)])

    def kept_and_moved(self, sc: Scalars) -> tuple[list[int], list[int]]:
        """Positions on `sc` of the kept copy's norms and of how far the slices moved
        since it was kept: the current values go into row 1, the kept ones are taken off,
        and one norm per run reads both rows."""
        kept = [0] * self._n
        moved = [0] * self._n
        for g in self._groups:
            now = g.buffer[1]
            torch.cat(g.parts(), out=now)
            now.sub_(g.buffer[0])
            starts = []
            for o, k, n in g.runs:
                both = torch.linalg.vector_norm(g.buffer[:, o:o + k * n].view(2, k, n), dim=2,
                                                dtype=g.wide)
                starts.append(sc.add_row(both.reshape(-1)))
            for i, (r, j) in zip(g.index, g.where):
                kept[i] = starts[r] + j
                moved[i] = starts[r] + g.runs[r][1] + j
        return kept, moved

    def unchanged(self, sc: Scalars, copy: list[torch.Tensor]
                  ) -> tuple[list[int], list[int], list[int]]:
        """For the half-precision slices: positions on `sc` of how many of each one's
        elements the kept copy has exactly as in `copy`, the index of each such slice,
        and its length."""
        pos: list[int] = []
        index: list[int] = []
        sizes: list[int] = []
        for g, c in zip(self._groups, copy):
            if g.buffer.element_size() >= 4 or not g.buffer.is_floating_point():
                continue
            same = g.buffer[0] == c
            starts = [sc.add_row(m.sum(dim=1, dtype=torch.float32)) for m in g.rows(same)]
            for i, (r, j) in zip(g.index, g.where):
                pos.append(starts[r] + j)
                index.append(i)
                sizes.append(g.runs[r][2])
        return pos, index, sizes

    def _norms(self, sc: Scalars, flats: list[torch.Tensor]) -> list[int]:
        pos = [0] * self._n
        for g, flat in zip(self._groups, flats):
            starts = [sc.add_row(torch.linalg.vector_norm(m, dim=1, dtype=g.wide))
                      for m in g.rows(flat)]
            for i, (r, j) in zip(g.index, g.where):
                pos[i] = starts[r] + j
        return pos
