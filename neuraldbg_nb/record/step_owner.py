"""Which optimizer's steps are the watch's steps, and what the other optimizers train.

A loop may step several optimizers: a GAN's two, a second one made for the same model
later in the block (Adam, then L-BFGS), or one made for another model (an earlier copy
of the watched one). The first optimizer to step that trains a watched weight is the
primary: its steps close the watch's steps and its learning rate is the step's. The
others' updates are measured with the primary's (`WeightProbe`), and an optimizer that
trains none of the watched weights is counted and left alone, unless what it trains is
the model's input (`trains_the_input`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from .discovery import Models
from .membership import Membership, keeps_state


class StepOwner:
    """The primary optimizer of one watch, and what each other optimizer trains.

    The watched weights are `models.owners`, which grows as models are found; where the
    watch was not given its models, any optimizer may be the first to train a model the
    watch has yet to find."""

    def __init__(self, models: Models, rescan: Callable[[], None] | None = None) -> None:
        """`rescan`: walks the models for layers and weights the loop replaced inside the
        watch and hooks the new ones (`Models.rescan`), asked once for each optimizer
        that holds none of the watched weights: one made for a layer the loop just put
        in (a new head, and an optimizer over it alone) trains watched weights."""
        self._owners = models.owners
        self._rescan = rescan
        self._rescanned: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._models = models
        self._index = models.index
        self._trace = models.trace
        self._given = models.given
        self._other_lr = models.other_lr
        self._primary: weakref.ref[torch.optim.Optimizer] | None = None
        # other optimizers: the watched weights' `Models.version` when last asked, and whether
        # they train any of them
        self._others: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, bool]] = \
            weakref.WeakKeyDictionary()
        # steps of other optimizers since the primary's last one (see `_takes_over`)
        self._in_a_row: weakref.WeakKeyDictionary[torch.optim.Optimizer, int] = \
            weakref.WeakKeyDictionary()
        self.foreign_steps = 0
        """Steps of optimizers that train no watched weight, while none that does had
        stepped: an optimizer made for an earlier copy of the model (`live.notes.unstepped`)."""
        self.membership = Membership()
        """Which watched weights the optimizers hold (every optimizer that steps is seen)."""
        self.input_trained = False
        """The primary optimizer trains the model's input: it is not data, and not judged
        as data (an image optimised from all zeros read "input batch is all zeros")."""

    @property
    def primary(self) -> torch.optim.Optimizer | None:
        """The optimizer whose steps are the watch's steps; None before the first one (or
        once it was freed: the next one to train watched weights takes its place)."""
        return self._primary() if self._primary is not None else None

    def before_step(self, opt: torch.optim.Optimizer,
                    called_with: weakref.ref[torch.Tensor] | None) -> torch.optim.Optimizer | None:
        """Called as `opt` starts a step: the primary from this step on (`opt` itself
        where it is or becomes the primary), or None where no optimizer trains watched
        weights yet and `opt` does not either (a foreign step, counted). `called_with`: the
        tensor the watched model was last called with (`trains_the_input`)."""
        first = self.membership.saw(opt)
        primary = self.primary
        if primary is None:
            if not self._owns(opt):
                if not self.trains_the_input(opt, called_with):
                    self.foreign_steps += 1
                    return None
                self.input_trained = True
            self._primary = weakref.ref(opt)
            primary = opt
        elif primary is not opt and self._takes_over(opt):
            primary = opt
        if primary is opt and self._in_a_row:
            self._in_a_row.clear()
        if first and primary is opt and not opt.state and keeps_state(opt):
            self.membership.fresh_optimizer = True
        return primary

    def trains_watched(self, opt: torch.optim.Optimizer) -> bool:
        """Whether an optimizer other than the primary one updates watched weights;
        asked again only when the watched weights change (`Models.version`). Layers it trains alone are marked:
        the step's learning rate is the primary's, not theirs (`LayerInfo.primary_lr`)."""
        known = self._others.get(opt)
        if known is None or known[0] != self._models.version:
            known = self._others[opt] = (self._models.version, bool(self._owners)
                                         and self._owns(opt))
            primary = self.primary
            if known[1] and primary is not None:
                mine = {id(p) for g in primary.param_groups for p in g["params"]}
                theirs = {id(p) for g in opt.param_groups for p in g["params"]}
                for _, p, mid in self._owners:
                    if id(p) in theirs and id(p) not in mine:
                        self._other_lr.add(mid)
                        if mid in self._index:
                            self._trace.update_layer(self._index[mid], primary_lr=False)
        return known[1]

    def trains_the_input(self, opt: torch.optim.Optimizer,
                         called_with: weakref.ref[torch.Tensor] | None) -> bool:
        """Whether `opt` optimises what the model is fed, not the model: style transfer,
        feature visualisation, adversarial examples, model inversion. It trains the very
        tensor the model was last called with (`called_with`), or the model has no weight
        that takes a gradient (its input is then what the loop trains, however it is
        transformed on the way in). Its steps are the watch's steps: taken for an
        optimizer of another model, such a loop would be recorded as one step."""
        last = called_with() if called_with is not None else None
        if last is not None and any(p is last for g in opt.param_groups for p in g["params"]):
            return True
        return bool(self._owners) and not any(p.requires_grad for _, p, _ in self._owners)

    def _owns(self, opt: torch.optim.Optimizer) -> bool:
        if not self._owners:
            return not self._given
        if self._holds_watched(opt):
            return True
        if self._rescan is None or opt in self._rescanned:
            return False
        self._rescanned.add(opt)  # (an optimizer of another model: one walk, not one a step)
        self._rescan()
        return self._holds_watched(opt)

    def _holds_watched(self, opt: torch.optim.Optimizer) -> bool:
        mine = {id(p) for _, p, _ in self._owners}
        return any(id(p) in mine for g in opt.param_groups for p in g["params"])

    def _takes_over(self, opt: torch.optim.Optimizer) -> bool:
        """Whether `opt`, not the primary optimizer, marks the steps from now on: it
        trains watched weights and steps a second time without the primary stepping in
        between (a second model trained after the first in the same block, while the
        first one's optimizer still exists). A GAN's generator steps once per
        discriminator step, and a critic's extra steps take over from a generator that
        stepped first. Without it, the second model's steps would never close: its
        training would not be recorded, and the per-step lists would grow with it."""
        if not self.trains_watched(opt):
            return False
        self._in_a_row[opt] = self._in_a_row.get(opt, 0) + 1
        if self._in_a_row[opt] < 2:
            return False
        self._primary = weakref.ref(opt)
        self._others = weakref.WeakKeyDictionary()  # judged again against the new one
        self._other_lr.clear()
        for i in range(self._trace.n_layers):
            self._trace.update_layer(i, primary_lr=True)
        return True
