"""The weights after each update, and on sampled steps how far the update moved them.

A fixed slice of each trained weight is read after every optimizer step (its norm: a
weight that blows up or goes non-finite) and, on sampled steps, compared with its copy
from before the update (the update-to-weight ratio, and for half-precision weights how
many elements the update left exactly as they were). The numbers are queued on the
probe's `reductions.Scalars` and come back with the next step's one transfer: they are
written into the row of the step they belong to, one step late (`record`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..trace.columns import WEIGHT_PROBE, Trace
from . import reductions
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
        self._plan: tuple[reductions.StackPlan, list[int]] = ([], [])  # weight slices, modules
        self._idx: list[int] | None = None  # their layers' indices, once numbered
        self._out: list[torch.Tensor] = []  # the after-update copy's stacks, reused
        self._out_read = False  # `_out` holds the slices as the last update left them
        self._before: reductions.Stacks | None = None  # the slices before a sampled update
        # the weights' norms after the last update: (positions, their layers)
        self._post: Part | None = None
        # the sampled update's norms: (moved, their layers, before, their layers)
        self._update: tuple[list[int], list[int], list[int], list[int]] | None = None
        # the sampled update's count of half-precision weights it left unchanged:
        # (positions of the counts, their layers, elements each count is of)
        self._unmoved: tuple[list[int], list[int], list[int]] | None = None

    @property
    def measuring(self) -> bool:
        """An update is being measured this step (another optimizer's adds to it)."""
        return self._update is not None

    def _slices(self) -> tuple[reductions.StackPlan, list[int]]:
        """The first `WEIGHT_PROBE` elements of each trained weight (about as many of its
        first rows where it is not contiguous, e.g. channels-last), as views grouped for
        `reductions.stacked`, and the id of its layer's module (`_layers` numbers them: a
        step given a closure copies the weights before its first forward, and layers are
        numbered in forward order). Kept from step to step while every weight keeps its
        storage and its `requires_grad` (so `p.data = ...` and freezing are followed),
        which costs one address read per weight instead of building them again."""
        key = [p.data_ptr() if p.requires_grad else 0 for _, p, _ in self._owners]
        if key != self._key:
            views, mids = [], []
            for _, p, mid in self._owners:
                if p.requires_grad:
                    w = p.detach()
                    views.append(w.view(-1)[:WEIGHT_PROBE] if w.is_contiguous() else
                                 w[:max(1, WEIGHT_PROBE // max(1, w[0].numel()))])
                    mids.append(mid)
            plan = reductions.stack_plan(views)
            self._key, self._plan, self._idx = key, (plan, mids), None
            self._out = reductions.stack_buffers(plan)
            self._out_read = False
        return self._plan

    def _layers(self) -> list[int]:
        """The layer index of each of the slices, in their order."""
        if self._idx is None:
            self._idx = [self._layer(mid) for mid in self._plan[1]]
        return self._idx

    def keep_before(self) -> None:
        """Copy the slices before an update that is to be measured."""
        self._before = reductions.stacked(self._slices()[0])

    def after_update(self, sc: reductions.Scalars, primary: bool) -> None:
        """After an optimizer's update: the slices' norms (every step) and, where a copy
        from before it was kept, the update's size, queued on `sc`. After the primary
        optimizer's update, and after every other one that trains watched weights (a
        GAN's generator): the weights are read after the last of them, and each one's
        update adds to the step's (each weight is moved by one of them, so their squared
        norms add up; the primary's copy before the update gives the sizes they are
        measured against).

        A fixed slice, not the whole weight: an update that moves weights by more than
        their size (a bad learning rate, an in-place edit) moves every part of them, and
        a slice costs the same for a small layer and a large one, where reading all the
        weights would be a full pass over the model. The slices are copied in stacks of
        equal size (`reductions.stacked`): a few ops for hundreds of layers."""
        plan = self._slices()[0]
        idx = self._layers()
        now = reductions.stacked(plan, self._out)  # read below and dropped: one buffer
        self._out_read = True
        before, self._before = self._before, None
        if before is not None and len(before) == len(now) and all(
                a == b and x.shape == y.shape for (a, x), (b, y) in zip(now, before)):
            diffs = [(i, x - y) for (i, x), (_, y) in zip(now, before)]
            moved = reductions.stacked_norms(diffs, sc)
            if primary or self._update is None:
                self._update = (moved, idx, reductions.stacked_norms(before, sc), idx)
                self._unmoved = _unmoved(now, before, idx, sc)
            else:
                m, m_idx, b, b_idx = self._update
                self._update = (m + moved, m_idx + idx, b, b_idx)
        self._post = (reductions.stacked_norms(now, sc), idx)

    def queue_edits(self, sc: reductions.Scalars) -> Part | None:
        """Before the update, how far each weight slice moved since the last update left
        it (norms of the differences, queued on `sc`): a weight changed outside the
        optimizer, before the step's forward. None where there is no such copy (the first
        step, a weight replaced or frozen since)."""
        plan = self._plan[0]  # as the last update left them (`after_update` checked them)
        if not self._out_read or not plan:
            return None
        now = reductions.stacked(plan)
        diffs = [(i, x - y.reshape(len(i), -1)) for (i, x), y in zip(now, self._out)]
        return reductions.stacked_norms(diffs, sc), self._layers()

    def parts(self) -> list[Part]:
        """The norms waiting in the transfer, for `step_row.layer_norms`: the weights
        after the last update and, if it was measured, its moved and before norms."""
        if self._post is None:
            return []
        if self._update is None:
            return [self._post]
        moved, moved_idx, before, before_idx = self._update
        return [self._post, (moved, moved_idx), (before, before_idx)]

    def record(self, trace: Trace, step: int, norms: np.ndarray, v: list[float]) -> None:
        """Write the last update's numbers into row `step` (the step it ended): `norms`
        are the per-layer norms of `parts`, in their order, and `v` the transfer they
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
        self._post = self._update = self._unmoved = None

    def flush(self, trace: Trace, sc: reductions.Scalars) -> bool:
        """At exit: the last update's weight norms go into the last row, in a transfer of
        their own (which empties `sc`); False where there were none."""
        if self._post is None or trace.n_steps == 0:
            return False
        pos, idx = self._post
        trace.set_layer_values("param_norm", trace.n_steps - 1,
                               layer_norms(sc.to_host(), [(pos, idx)], trace.n_layers)[0])
        self._post = self._update = self._unmoved = None
        return True

    def release(self) -> None:
        """Drop the copy kept from before an update (the watch ends or failed)."""
        self._before = None


def _unmoved(now: reductions.Stacks, before: reductions.Stacks, idx: list[int],
             sc: reductions.Scalars) -> tuple[list[int], list[int], list[int]] | None:
    """How many of each half-precision weight slice's elements the primary optimizer's
    update left exactly as they were: in bfloat16 an update below about 1/256 of a weight
    (float16: 1/2048) rounds away, and a layer whose updates all do stops learning
    without any other number moving (`updates.stall_findings`). float32 weights are left
    out: there an element stays put only where its gradient is zero (a dead unit's),
    which other detectors report. Only the primary's update: another optimizer's leaves
    the primary's weights unchanged by design."""
    pos: list[int] = []
    layers: list[int] = []
    sizes: list[int] = []
    for (i, x), (_, y) in zip(now, before):
        if x.element_size() < 4 and x.is_floating_point():
            start = sc.add_row((x == y).sum(dim=1, dtype=torch.float32))
            pos += range(start, start + len(i))
            layers += [idx[k] for k in i]
            sizes += [x.shape[1]] * len(i)
    return (pos, layers, sizes) if pos else None
