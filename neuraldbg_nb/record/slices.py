"""Fixed slices of many weights, copied and normed in a few ops (`Slices`).

The weight probe reads a slice of every trained weight after each update (its norm) and
the first elements of each again before the next one (the edit check). On a
notebook-sized model a step is a few milliseconds and each op costs several microseconds
right after the training's own (cold caches), so the count of ops is the cost: here the
slices of all weights of one device and dtype are normed by one `_foreach_norm` as the
update left them (`keep`), and their first elements copied by one `torch.cat` into one
flat buffer; copies of whole slices (`take`: around a sampled update) are normed, where
`STACKED` or more slices share a length, by one `vector_norm` over a 2-D view. A watch of
a hundred layers pays about as many ops as one of ten, and no copy of its slices at every
step (a 100-layer MLP's would be 2 MB). The edit check before each update
(`_Group.edit_totals`) reads two norms over all the slices of a group, and a norm per
slice only where one moved: on the CPU a `_foreach_norm` costs about a microsecond a
tensor however small it is.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from .reductions import STACKED, Scalars

Run = tuple[int, int, int]
"""Slices of one length, side by side in a flat copy: (offset, how many, length)."""


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
    """The slices of one (device, dtype): their sources in buffer order, where each slice
    lies in a flat copy of them all (`take`), and the edit check's buffers of each slice's
    first elements: as the last update left them (`kept`) and as they are now (`edits`)."""

    def __init__(self, sources: list[tuple[int, torch.Tensor, bool]], size: int,
                 edit: int) -> None:
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
        self.length = offset
        """Elements of all the slices: the length of a flat copy of them (`take`)."""
        first = sources[0][1]
        # half-precision norms overflow at 65504: taken in float32
        self.wide = torch.float32 if first.element_size() < 4 else None
        self.stacked = [r for r, (_, k, _) in enumerate(self.runs) if k >= STACKED]
        self._lone = [(o + j * n, n) for r, j in self.where
                      for o, k, n in (self.runs[r],) if k < STACKED]  # (offset, length)
        self._layout_of: list[int] | None = None
        # the edit check's buffers: the first `edit` elements of each slice
        self._edit = edit
        at = 0
        starts = []  # per slice in buffer order: where its first elements lie
        for r, j in self.where:
            _, _, n = self.runs[r]
            starts.append((at, min(n, edit)))
            at += min(n, edit)
        with torch.inference_mode(False):  # written to at every step, also under inference
            self.edits = torch.empty(at, dtype=first.dtype, device=first.device)
            self.kept = torch.empty(at, dtype=first.dtype, device=first.device)
        self._edit_views = [  # per slice in buffer order: its part of `edits` and `kept`
            (self.edits[o:o + e], self.kept[o:o + e]) for o, e in starts]
        self._edit_heads = [t[:edit] for t, again in self._sources if not again]

    def edit_parts(self) -> list[torch.Tensor]:
        """The first `edit` elements of each slice now, as the views `torch.cat` reads."""
        if not self._again:
            return self._edit_heads
        return [t.reshape(-1)[:self._edit] if again else t[:self._edit]
                for t, again in self._sources]

    def keep(self, sc: Scalars) -> list[int]:
        """After an update: the first `edit` elements of each slice copied into `kept`,
        and the slices' norms taken now (a later edit must not change them), on `sc`;
        their positions there, per slice in buffer order."""
        torch.cat(self.edit_parts(), out=self.kept)
        parts = self.parts()
        start = sc.extend(list(torch._foreach_norm(parts, 2, dtype=self.wide)),
                          one_device=True)
        return list(range(start, start + len(parts)))

    def edit_totals(self, sc: Scalars) -> tuple[int, int]:
        """Positions on `sc` of two norms over all the slices: of how far their first
        `edit` elements moved since `keep`, and of those elements as kept. The first is
        0 exactly where no slice moved (a sum of squares is 0 only where each one is),
        and the second finite where every slice's is: the step that no edit touched, the
        usual one, needs no norm per slice (`edit_norms`). Both buffers stay as they are
        until the next call, for `edit_norms`."""
        torch.cat(self.edit_parts(), out=self.edits)
        self.edits.sub_(self.kept)
        start = sc.norms([self.edits, self.kept], self.wide)
        return start, start + 1

    def edit_norms(self, sc: Scalars) -> tuple[list[int], list[int]]:
        """Positions on `sc`, per slice in buffer order, of the norms of its move and of
        its first elements as kept, read from the buffers of the last `edit_totals`
        (a step where some slice moved: one op for all of them)."""
        moved = [m for m, _ in self._edit_views]
        heads = [h for _, h in self._edit_views]
        start = sc.norms(moved + heads, self.wide)
        k = len(moved)
        return list(range(start, start + k)), list(range(start + k, start + 2 * k))

    def _layout(self) -> list[int]:
        """Where `norms` puts each slice's norm, per slice in buffer order, counted from
        the first value: each stacked run's rows in turn, then the lone slices'. Worked
        out once."""
        if self._layout_of is None:
            run_at: dict[int, int] = {}
            at = 0
            for r in self.stacked:
                run_at[r] = at
                at += self.runs[r][1]
            out: list[int] = []
            for r, j in self.where:
                if r in run_at:
                    out.append(run_at[r] + j)
                else:
                    out.append(at)
                    at += 1
            self._layout_of = out
        return self._layout_of

    def lone_views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The slices of `flat` (a flat copy of them all, `take`) that are not in a
        stacked run, as views, in buffer order."""
        return [flat[o:o + n] for o, n in self._lone]

    def norms(self, sc: Scalars, flat: torch.Tensor) -> list[int]:
        """Positions on `sc` of the norms of each slice of `flat` (a flat copy of them
        all, `take`, or a difference of two), taken now, in buffer order: each stacked
        run's in one `vector_norm`, the others' in one `_foreach_norm`."""
        base = len(sc)
        for r in self.stacked:
            o, k, n = self.runs[r]
            sc.add_row(torch.linalg.vector_norm(flat[o:o + k * n].view(k, n), dim=1,
                                                dtype=self.wide))
        if self._lone:
            sc.extend(list(torch._foreach_norm(self.lone_views(flat), 2, dtype=self.wide)),
                      one_device=True)
        return [base + at for at in self._layout()]

    def parts(self) -> list[torch.Tensor]:
        """The slices' current values, as the views `torch.cat` reads."""
        if not self._again:
            return [t for t, _ in self._sources]
        return [t.reshape(-1)[:self._size] if again else t for t, again in self._sources]

    def rows(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """`flat` (a flat copy of the slices, `take`, or one like it) as one (how many,
        length) matrix per run."""
        return [flat[o:o + k * n].view(k, n) for o, k, n in self.runs]


def _length(t: torch.Tensor, again: bool, size: int) -> int:
    return min(size, t.numel()) if again else t.numel()


class Slices:
    """The first `size` elements of each weight (`flat_slice`), grouped by device and
    dtype: their norms as the last update left them, with a copy of their first elements
    to tell later what moved since (`keep`). Positions handed back are in the order the
    weights were given."""

    def __init__(self, weights: list[torch.Tensor], size: int, edit: int | None = None
                 ) -> None:
        by: dict[tuple[torch.device, torch.dtype], list[tuple[int, torch.Tensor, bool]]] = \
            defaultdict(list)
        for i, w in enumerate(weights):
            t, again = flat_slice(w, size)
            by[(w.device, w.dtype)].append((i, t, again))
        self._groups = [_Group(s, size, size if edit is None else edit) for s in by.values()]
        self._n = len(weights)

    def __len__(self) -> int:
        return self._n

    def keep(self, sc: Scalars) -> list[int]:
        """After an update: the norms of the slices as it left them, queued on `sc` (taken
        now: an edit before the next step boundary must not change them), and the edit
        check's copy of their first elements (`edit_totals`). The norms' positions on
        `sc`, per weight."""
        pos = [0] * self._n
        for g in self._groups:
            for i, p in zip(g.index, g.keep(sc)):
                pos[i] = p
        return pos

    def take(self) -> list[torch.Tensor]:
        """A fresh copy of the slices, one flat tensor per group (before and after an
        update that is to be measured)."""
        return [torch.cat(g.parts()) for g in self._groups]

    def like(self, copy: list[torch.Tensor]) -> bool:
        """`copy` is a `take` of these slices."""
        return len(copy) == len(self._groups) and all(
            c.shape[0] == g.length for c, g in zip(copy, self._groups))

    def norms(self, sc: Scalars, copy: list[torch.Tensor]) -> list[int]:
        """Positions on `sc` of the norms of each slice in `copy` (a `take`)."""
        return self._norms(sc, copy)

    def moved(self, sc: Scalars, before: list[torch.Tensor],
              after: list[torch.Tensor]) -> list[int]:
        """Positions on `sc` of the norms of what `after` differs from `before` by (two
        `take`s: the update's move, where they were taken around it)."""
        return self._norms(sc, [a - b for a, b in zip(after, before)])

    def edit_totals(self, sc: Scalars) -> list[int]:
        """Positions on `sc` of each group's two edit totals (`_Group.edit_totals`), in
        pairs: whether any slice moved since `keep`, told for all of them at once
        (`edit_norms` tells it per slice)."""
        totals: list[int] = []
        for g in self._groups:
            totals.extend(g.edit_totals(sc))
        return totals

    def edit_norms(self, sc: Scalars) -> tuple[list[int], list[int]]:
        """Positions on `sc`, per weight, of the norms of its slice's move and of its
        first elements as kept, from the last `edit_totals`."""
        moved, heads = [0] * self._n, [0] * self._n
        for g in self._groups:
            m, h = g.edit_norms(sc)
            for i, p, q in zip(g.index, m, h):
                moved[i], heads[i] = p, q
        return moved, heads

    def unchanged(self, sc: Scalars, before: list[torch.Tensor],
                  after: list[torch.Tensor]) -> tuple[list[int], list[int], list[int]]:
        """For the half-precision slices: positions on `sc` of how many of each one's
        elements `after` has exactly as in `before` (two `take`s around an update), the
        index of each such slice, and its length."""
        pos: list[int] = []
        index: list[int] = []
        sizes: list[int] = []
        for g, b, a in zip(self._groups, before, after):
            if a.element_size() >= 4 or not a.is_floating_point():
                continue
            same = a == b
            starts = [sc.add_row(m.sum(dim=1, dtype=torch.float32)) for m in g.rows(same)]
            for i, (r, j) in zip(g.index, g.where):
                pos.append(starts[r] + j)
                index.append(i)
                sizes.append(g.runs[r][2])
        return pos, index, sizes

    def _norms(self, sc: Scalars, flats: list[torch.Tensor]) -> list[int]:
        pos = [0] * self._n
        for g, flat in zip(self._groups, flats):
            for i, p in zip(g.index, g.norms(sc, flat)):
                pos[i] = p
        return pos
