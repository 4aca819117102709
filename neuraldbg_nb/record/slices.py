"""Fixed slices of many weights, copied and normed in a few ops (`Slices`).

The weight probe reads a slice of every trained weight after each update and again
before the next one. On a notebook-sized model a step is a few milliseconds and each op
costs several microseconds right after the training's own (cold caches), so the count of
ops is the cost: here the slices of all weights of one device and dtype are copied by one
`torch.cat` into one flat buffer; the norms of the slices of one length, where there are
`STACKED` or more of them, come from one `vector_norm` over a 2-D view of it, and those
of all other slices from one `_foreach_norm`. A watch of a hundred layers pays about as
many ops as one of ten. The edit check before each update (`_Group.edit_totals`) reads
two norms over all the slices of a group, and a norm per slice only where one moved: on
the CPU a `_foreach_norm` costs about a microsecond a tensor however small it is.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from .reductions import STACKED, Scalars

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
    slice lies in the flat buffer, the buffer (`kept`: the copy `keep` takes), and the
    edit check's copy of each slice's first elements (`edits`)."""

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
        first = sources[0][1]
        # half-precision norms overflow at 65504: taken in float32
        self.wide = torch.float32 if first.element_size() < 4 else None
        with torch.inference_mode(False):  # written to at every step, also under inference
            self.kept = torch.empty(offset, dtype=first.dtype, device=first.device)
        self.stacked = [r for r, (_, k, _) in enumerate(self.runs) if k >= STACKED]
        self._lone = [(o + j * n, n) for r, j in self.where
                      for o, k, n in (self.runs[r],) if k < STACKED]  # (offset, length)
        self._lone_kept = self.lone_views(self.kept)
        self._layout_of: list[int] | None = None
        # the edit check's copy: the first `edit` elements of each slice, run by run
        self._edit = edit
        self._edit_runs = []  # per run: (offset in the edit buffer, length read)
        at = 0
        for _, k, n in self.runs:
            e = min(n, edit)
            self._edit_runs.append((at, e))
            at += k * e
        with torch.inference_mode(False):
            self.edits = torch.empty(at, dtype=first.dtype, device=first.device)
            self.heads = torch.empty(at, dtype=first.dtype, device=first.device)
            # where each element of `heads` lies in `kept`, run by run, row by row
            self._head_index = torch.cat([
                (o + torch.arange(k, device=first.device).unsqueeze(1) * n
                 + torch.arange(min(n, edit), device=first.device)).reshape(-1)
                for o, k, n in self.runs])
        self._edit_views = [  # per slice in buffer order: its part of `edits` and `heads`
            (self.edits[oe + j * e:][:e], self.heads[oe + j * e:][:e])
            for r, j in self.where for oe, e in (self._edit_runs[r],)]
        self._edit_heads = [t[:edit] for t, again in self._sources if not again]

    def edit_parts(self) -> list[torch.Tensor]:
        """The first `edit` elements of each slice now, as the views `torch.cat` reads."""
        if not self._again:
            return self._edit_heads
        return [t.reshape(-1)[:self._edit] if again else t[:self._edit]
                for t, again in self._sources]

    def edit_totals(self, sc: Scalars) -> tuple[int, int]:
        """Positions on `sc` of two norms over all the slices: of how far their first
        `edit` elements moved since the copy was kept, and of those elements as kept. The
        first is 0 exactly where no slice moved (a sum of squares is 0 only where each
        one is), and the second finite where every slice's is: the step that no edit
        touched, the usual one, needs no norm per slice (`edit_norms`). Both buffers
        stay as they are until the next call, for `edit_norms`."""
        torch.cat(self.edit_parts(), out=self.edits)
        torch.index_select(self.kept, 0, self._head_index, out=self.heads)
        self.edits.sub_(self.heads)
        start = sc.norms([self.edits, self.heads], self.wide)
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
        """The slices of `flat` (the buffer, or a copy like it) that are not in a stacked
        run, as views, in buffer order."""
        return [flat[o:o + n] for o, n in self._lone]

    def norms(self, sc: Scalars, flat: torch.Tensor) -> list[int]:
        """Positions on `sc` of the norms of each slice of `flat` (the buffer, or a copy
        like it), in buffer order: each stacked run's in one `vector_norm`, the others'
        in one `_foreach_norm` (the buffer's with the step's other norms, `Scalars.norms`)."""
        base = len(sc)
        for r in self.stacked:
            o, k, n = self.runs[r]
            sc.add_row(torch.linalg.vector_norm(flat[o:o + k * n].view(k, n), dim=1,
                                                dtype=self.wide))
        if self._lone and flat is self.kept:  # (kept as is until the transfer)
            sc.norms(self._lone_kept, self.wide)
        elif self._lone:  # a copy that is let go before then
            sc.extend(list(torch._foreach_norm(self.lone_views(flat), 2, dtype=self.wide)),
                      one_device=True)
        return [base + at for at in self._layout()]

    def parts(self) -> list[torch.Tensor]:
        """The slices' current values, as the views `torch.cat` reads."""
        if not self._again:
            return [t for t, _ in self._sources]
        return [t.reshape(-1)[:self._size] if again else t for t, again in self._sources]

    def rows(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """`flat` (the buffer, or a copy like it) as one (how many, length) matrix per
        run."""
        return [flat[o:o + k * n].view(k, n) for o, k, n in self.runs]


def _length(t: torch.Tensor, again: bool, size: int) -> int:
    return min(size, t.numel()) if again else t.numel()


class Slices:
    """The first `size` elements of each weight (`flat_slice`), grouped by device and
    dtype, with a copy as the last update left them (`keep`) to tell later what moved
    since. Positions handed back are in the order the weights were given."""

    def __init__(self, weights: list[torch.Tensor], size: int, edit: int | None = None
                 ) -> None:
        by: dict[tuple[torch.device, torch.dtype], list[tuple[int, torch.Tensor, bool]]] = \
            defaultdict(list)
        for i, w in enumerate(weights):
            t, again = flat_slice(w, size)
            by[(w.device, w.dtype)].append((i, t, again))
        self._groups = [_Group(s, size, size if edit is None else edit) for s in by.values()]
        self._n = len(weights)
        self.kept = False
        """`keep` took a copy since the slices were made."""

    def __len__(self) -> int:
        return self._n

    def keep(self) -> None:
        """Copy the slices as they are now (after an update) into the buffers."""
        for g in self._groups:
            torch.cat(g.parts(), out=g.kept)
        self.kept = True

    def take(self) -> list[torch.Tensor]:
        """A fresh copy of the slices, one flat tensor per group (before an update that
        is to be measured)."""
        return [torch.cat(g.parts()) for g in self._groups]

    def like(self, copy: list[torch.Tensor]) -> bool:
        """`copy` is a `take` of these slices."""
        return len(copy) == len(self._groups) and all(
            c.shape[0] == g.kept.shape[0] for c, g in zip(copy, self._groups))

    def kept_norms(self, sc: Scalars) -> list[int]:
        """Positions on `sc` of the norms of the copy `keep` took."""
        return self._norms(sc, [g.kept for g in self._groups])

    def norms(self, sc: Scalars, copy: list[torch.Tensor]) -> list[int]:
        """Positions on `sc` of the norms of each slice in `copy` (a `take`)."""
        return self._norms(sc, copy)

    def moved(self, sc: Scalars, copy: list[torch.Tensor]) -> list[int]:
        """Positions on `sc` of the norms of what the kept copy differs from `copy` by
        (the update's move, where `copy` was taken before it)."""
        return self._norms(sc, [g.kept - c for g, c in zip(self._groups, copy)])

    def kept_and_edit_totals(self, sc: Scalars) -> tuple[list[int], list[int]]:
        """Positions on `sc` of the kept copy's norms, per weight, and of each group's
        two edit totals (`_Group.edit_totals`), in pairs: whether any slice moved since
        the copy was kept, told for all of them at once (`edit_norms` tells it per
        slice)."""
        totals: list[int] = []
        for g in self._groups:
            totals.extend(g.edit_totals(sc))
        return self.kept_norms(sc), totals

    def edit_norms(self, sc: Scalars) -> tuple[list[int], list[int]]:
        """Positions on `sc`, per weight, of the norms of its slice's move and of its
        first elements as kept, from the last `kept_and_edit_totals`."""
        moved, heads = [0] * self._n, [0] * self._n
        for g in self._groups:
            m, h = g.edit_norms(sc)
            for i, p, q in zip(g.index, m, h):
                moved[i], heads[i] = p, q
        return moved, heads

    def unchanged(self, sc: Scalars, copy: list[torch.Tensor]
                  ) -> tuple[list[int], list[int], list[int]]:
        """For the half-precision slices: positions on `sc` of how many of each one's
        elements the kept copy has exactly as in `copy`, the index of each such slice,
        and its length."""
        pos: list[int] = []
        index: list[int] = []
        sizes: list[int] = []
        for g, c in zip(self._groups, copy):
            if g.kept.element_size() >= 4 or not g.kept.is_floating_point():
                continue
            same = g.kept == c
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
