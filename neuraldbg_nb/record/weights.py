"""The weights after each update, and on sampled steps how far the update moved them.

A fixed slice of each trained weight is read after every optimizer step (its norm: a
weight that blows up or goes non-finite) and, on sampled steps, compared with its copy
from before the update (the update-to-weight ratio, and for half-precision weights how
many elements the update left exactly as they were). The numbers are queued on the
probe's `reductions.Scalars` and come back with the next step's one transfer: they are
written into the row of the step they belong to, one step late (`record`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..trace.columns import EDIT_PROBE, WEIGHT_PROBE, Trace
from . import reductions
from .slices import Slices
from .step_row import layer_fractions, layer_norms

# positions in the next transfer, and the layer each one is of
Part = tuple[list[int], list[int]]


class WeightProbe:
    """The weight slices of one watch, and the update measurements waiting for the next
    step's transfer.

    `owners` is the probe's list of watched weights, (name, parameter, module id), which
    grows as models are discovered; `layer` numbers a module's layer (forward order)."""

    def __init__(self, owners: list[tuple[str, nn.Parameter, int]],
                 layer: Callable[[int], int]) -> None:
        self._owners = owners
        self._layer = layer
        self._key: list[int] = []  # storage address of each trained weight, 0 if frozen
        self._set: Slices | None = None  # the trained weights' slices
        self._mids: list[int] = []  # the module id of each slice's weight
        self._idx: list[int] | None = None  # their layers' indices, once numbered
        # the slices holding the copy the last update left, and their layers, until the
        # step boundary reads its norms (`queue`)
        self._last: tuple[Slices, list[int]] | None = None
        # the slices before a sampled update, and the ids of the weights they are of (a
        # weight the loop replaced since is another tensor, of the same shape)
        self._before: tuple[list[int], list[torch.Tensor]] | None = None
        self._pids: list[int] = []  # the id of each slice's parameter
        # the sampled update's norms: (moved, their layers, before, their layers)
        self._update: tuple[list[int], list[int], list[int], list[int]] | None = None
        # the sampled update's count of half-precision weights it left unchanged:
        # (positions of the counts, their layers, elements each count is of)
        self._unmoved: tuple[list[int], list[int], list[int]] | None = None

    @property
    def measuring(self) -> bool:
        """An update is being measured this step (another optimizer's adds to it)."""
        return self._update is not None

    def _slices(self) -> Slices:
        """The first `WEIGHT_PROBE` elements of each trained weight in its memory order
        (`slices.flat_slice`), and the id of its layer's module (`_layers` numbers them: a
        step given a closure copies the weights before its first forward, and layers are
        numbered in forward order). Kept from step to step while every weight keeps its
        storage and its `requires_grad` (so `p.data = ...` and freezing are followed),
        which costs one address read per weight instead of building them again."""
        key = [p.data_ptr() if p.requires_grad else 0 for _, p, _ in self._owners]
        if key != self._key or self._set is None:
            trained = [(p.detach(), mid) for _, p, mid in self._owners if p.requires_grad]
            self._key, self._idx = key, None
            self._set = Slices([w for w, _ in trained], WEIGHT_PROBE, EDIT_PROBE)
            self._mids = [mid for _, mid in trained]
            self._pids = [id(p) for _, p, _ in self._owners if p.requires_grad]
        return self._set

    def _layers(self) -> list[int]:
        """The layer index of each of the slices, in their order."""
        if self._idx is None:
            self._idx = [self._layer(mid) for mid in self._mids]
        return self._idx

    def keep_before(self) -> None:
        """Copy the slices before an update that is to be measured."""
        s = self._slices()
        self._before = (self._pids, s.take())

    def after_update(self, sc: reductions.Scalars, primary: bool) -> None:
        """After an optimizer's update: the slices are copied (their norms are read at
        the next step boundary, `queue`) and, where a copy from before it was kept, the
        update's size is queued on `sc`. After the primary optimizer's update, and after
        every other one that trains watched weights (a GAN's generator): the weights are
        read after the last of them, and each one's update adds to the step's (each
        weight is moved by one of them, so their squared norms add up; the primary's copy
        before the update gives the sizes they are measured against).

        A fixed slice, not the whole weight: an update that moves weights by more than
        their size (a bad learning rate, an in-place edit) moves every part of them, and
        a slice costs the same for a small layer and a large one, where reading all the
        weights would be a full pass over the model. The slices of a device and dtype
        are copied in one op (`Slices`): a few ops for hundreds of layers."""
        s = self._slices()
        idx = self._layers()
        s.keep()
        self._last = (s, idx)
        before, self._before = self._before, None
        if before is not None and before[0] == self._pids and s.like(before[1]):
            copy = before[1]
            moved = s.moved(sc, copy)
            if primary or self._update is None:
                self._update = (moved, idx, s.norms(sc, copy), idx)
                self._unmoved = _unmoved(s, copy, idx, sc)
            else:
                m, m_idx, b, b_idx = self._update
                self._update = (m + moved, m_idx + idx, b, b_idx)

    def queue(self, sc: reductions.Scalars, edits: bool
              ) -> tuple[list[Part], EditCheck | None]:
        """At the step boundary: the norms waiting for the transfer, for
        `step_row.layer_norms`: the weights as the last update left them and, if it was
        measured, its moved and before norms; and, where `edits` (the optimizer is about
        to update them), the check of how far the first `EDIT_PROBE` elements of each
        slice moved since that update (`EditCheck`): a weight changed outside the
        optimizer, before the step's forward. No check where there is no such copy (the
        first step, a weight replaced or frozen since)."""
        last, self._last = self._last, None
        if last is None:
            self._update = self._unmoved = None
            return [], None
        s, idx = last
        moves = None
        if edits and s is self._set:
            post, totals = s.kept_and_edit_totals(sc)
            moves = EditCheck(s, idx, totals)
        else:
            post = s.kept_norms(sc)
        parts: list[Part] = [(post, idx)]
        if self._update is not None:
            moved_pos, moved_idx, before, before_idx = self._update
            parts += [(moved_pos, moved_idx), (before, before_idx)]
        return parts, moves

    def drop(self) -> list[Part]:
        """At the first step boundary: nothing is read (no update ended a step before
        it), and nothing stays waiting."""
        self._last = None
        self._update = self._unmoved = None
        return []

    def record(self, trace: Trace, step: int, norms: np.ndarray, v: list[float]) -> None:
        """Write the last update's numbers into row `step` (the step it ended): `norms`
        are the per-layer norms of `queue`'s parts, in their order, and `v` the transfer they
        came in (`step` -1: the first step, which no update ended). Nothing is then
        waiting; a copy kept for this step's own update stays."""
        if len(norms) > 0:
            trace.set_layer_values("param_norm", step, norms[0])
        if len(norms) > 2:
            moved, before = norms[1], norms[2]
            with np.errstate(divide="ignore", invalid="ignore"):  # inf: from all zeros
                ratio = np.where(before > 0, moved / before, np.where(moved > 0, np.inf,
                                                                      np.nan))
            trace.set_layer_values("update_ratio", step, ratio.astype(np.float32))
        if self._unmoved is not None and step >= 0:
            trace.set_layer_values("update_unmoved", step,
                                   layer_fractions(v, *self._unmoved, trace.n_layers))
        self._update = self._unmoved = None

    def flush(self, trace: Trace, sc: reductions.Scalars) -> bool:
        """At exit: the last update's weight norms go into the last row, in a transfer of
        their own (which empties `sc`); False where there were none."""
        last, self._last = self._last, None
        self._update = self._unmoved = None
        if last is None or trace.n_steps == 0:
            return False
        s, idx = last
        pos = s.kept_norms(sc)
        trace.set_layer_values("param_norm", trace.n_steps - 1,
                               layer_norms(sc.to_host(), [(pos, idx)], trace.n_layers)[0])
        trace.ended = True
        return True

    def release(self) -> None:
        """Drop the copies kept (the watch ends or failed)."""
        self._before = None
        self._last = None


class EditCheck:
    """How far each layer's weights moved outside the optimizer since its last update
    (`w_edited`), queued at the step boundary (`WeightProbe.queue`) and read after its
    transfer (`factors`)."""

    def __init__(self, slices: Slices, idx: list[int], totals: list[int]) -> None:
        self._slices = slices
        self._idx = idx
        self._totals = totals  # per group of slices: (moved, as kept) over all its slices

    def factors(self, v: list[float], sc: reductions.Scalars, n: int) -> list[float]:
        """Each of `n` layers' move over its norm as kept (`factor`), from the transfer
        `v`. Where no slice moved and every slice is finite (the totals say so), that is
        0 for each layer with weights without a norm per slice; otherwise the slices' norms
        are read in a transfer of their own (`sc`, emptied by the step's): the step an
        edit touched."""
        t = self._totals
        if all(v[m] == 0.0 and math.isfinite(v[h]) for m, h in zip(t[::2], t[1::2])):
            out = [math.nan] * n
            for i in self._idx:
                out[i] = 0.0
            return out
        moved, heads = self._slices.edit_norms(sc)
        rows = layer_norms(sc.to_host(), [(moved, self._idx), (heads, self._idx)], n)
        return [factor(d, w) for d, w in zip(rows[0].tolist(), rows[1].tolist())]


def factor(moved: float, norm: float) -> float:
    """A weight slice's move over its norm (`w_edited`): 0 where it did not move, inf
    where it moved off all-zero weights or to non-finite values, NaN where not read or
    where the weights were not finite as the last update left them (whatever they read
    now, no edit can be told from that: a run gone non-finite would read as edited at
    every step)."""
    if not norm < math.inf:
        return math.nan
    if moved == 0.0 or moved == math.inf:
        return moved
    return moved / norm if norm > 0 else (math.inf if moved > 0 else math.nan)


def _unmoved(s: Slices, before: list[torch.Tensor], idx: list[int],
             sc: reductions.Scalars) -> tuple[list[int], list[int], list[int]] | None:
    """How many of each half-precision weight slice's elements the primary optimizer's
    update left exactly as they were: in bfloat16 an update below about 1/256 of a weight
    (float16: 1/2048) rounds away, and a layer whose updates all do stops learning
    without any other number moving (`updates.stall_findings`). float32 weights are left
    out: there an element stays put only where its gradient is zero (a dead unit's),
    which other detectors report. Only the primary's update: another optimizer's leaves
    the primary's weights unchanged by design."""
    pos, which, sizes = s.unchanged(sc, before)
    return (pos, [idx[k] for k in which], sizes) if pos else None
