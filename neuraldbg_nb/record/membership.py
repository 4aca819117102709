"""Which watched weights an optimizer holds: trainable weights that get gradients which no
optimizer applies (a layer replaced after the optimizer was built, layers unfrozen without
adding them to it) train nothing, and nothing else says so.

Membership is read from the optimizers' parameter groups, not measured: the weights no
known optimizer holds are worked out again only when the watched weights or a known
optimizer's groups change (`_key`), and at each step only those weights are asked whether
they hold a gradient, so a model that its optimizers hold whole costs one comparison of a
few numbers a step. The optimizers known are those that stepped; where a weight with a
gradient, or is trainable, is held by none of them, the live optimizers are looked for
once (`gc`), so a GAN's second optimizer, which first steps after the first one closed
step 0, holds its generator from the start.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from ..trace.columns import (
    CUT,
    DETACHED,
    FROZEN,
    MODEL_CUT,
    REPLACED,
    UNHELD,
    UNTRAINED_MODEL,
    UNUSED,
)
from .discovery import Models

REACH_TESTS = 16
"""Layers whose output is replayed changed (`Membership.cut`'s `reaches`) at one step at
most; the others are asked at the next steps."""
REACH_TRIES = 3
"""Steps a layer's output is asked about where the replay cannot tell (no call of the
model heard in the step, a replay refused there), before its answer stays unknown."""


def keeps_state(opt: torch.optim.Optimizer) -> bool:
    """Whether `opt` keeps state from one step to the next (Adam's running averages,
    SGD's momentum buffers): every optimizer but SGD without momentum."""
    return not isinstance(opt, torch.optim.SGD) or any(
        g.get("momentum", 0) for g in opt.param_groups)


class Membership:
    """The watched weights that no known optimizer holds, and the step's verdict."""

    def __init__(self) -> None:
        self._opts: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._key: tuple = ()
        self._unheld: list[tuple[nn.Parameter, int]] = []
        self._stale = False  # an optimizer of the watched weights holds others no model has
        self._untrained: set[int] = set()  # weights of watched models no optimizer trains
        self._base: np.ndarray = np.zeros(0, np.float32)
        self._cut_base: np.ndarray = np.zeros(0, np.float32)
        self._looked = False  # the live optimizers were looked for under this key
        self._asked = False  # whether a weight no known optimizer holds is trainable
        self._layer_of: dict[int, int] = {}  # id of a held watched weight -> its layer
        self._held_by_layer: dict[int, list[nn.Parameter]] = {}
        self._root_of: np.ndarray = np.zeros(0, np.int64)  # each layer's model, -1: none
        self._graded: set[int] = set()  # layers with a gradient at another optimizer's step
        self._reach: dict[int, bool | None] = {}  # layer -> whether its output is used
        self._tries: dict[int, int] = {}  # layer -> steps its output's use was asked at
        self.fresh_optimizer = False
        """The primary optimizer, of a kind that keeps state between its steps
        (`keeps_state`), stepped for the first time with none yet: one made anew
        (`StepOwner.before_step`). The step boundary that reads it sets it back
        (`opt_fresh`)."""
        self.new_optimizer = False
        """An optimizer stepped for the first time (`saw`); the step boundary that reads
        it sets it back. A loop that builds an optimizer anew has often just replaced a
        layer (a new head, then `opt = SGD(model.parameters())`): the models are walked
        for it (`boundary.Rescans`) before the old layer, which no optimizer holds now,
        is judged."""

    def saw(self, opt: torch.optim.Optimizer) -> bool:
        """An optimizer stepped; whether for the first time."""
        if opt in self._opts:
            return False
        self._opts.add(opt)
        self.new_optimizer = True
        return True

    def column(self, models: Models, n: int) -> np.ndarray | None:
        """The step's `grad_unheld` per layer (`UNHELD`, `REPLACED`, `UNTRAINED_MODEL`; 0
        for layers whose weights the optimizers hold or have no gradient, NaN for layers
        without weights), or None before any optimizer stepped."""
        if not self._opts:
            return None
        self._refresh(models, n)
        # (a frozen weight's `.grad` is what it got before it was frozen)
        hits = [(p, i) for p, i in self._unheld if p.grad is not None and p.requires_grad]
        # looked for where a weight no known optimizer holds has a gradient, or is
        # trainable (asked once: a generator whose optimizer has yet to step is held)
        if not self._looked and (hits or not self._asked and any(
                p.requires_grad for p, _ in self._unheld)):
            self._looked = True
            optimizer = torch.optim.Optimizer  # by type: `isinstance` would ask objects
            for o in gc.get_objects():        # for their `__class__`, and some warn
                if issubclass(type(o), optimizer):
                    self._opts.add(o)
            self._refresh(models, n)
            hits = [(p, i) for p, i in self._unheld if p.grad is not None and p.requires_grad]
        self._asked = True
        if not hits:
            return self._base
        out = self._base.copy()
        for p, i in hits:
            out[i] = max(out[i], UNTRAINED_MODEL if id(p) in self._untrained else
                         REPLACED if self._stale else UNHELD)
        return out

    def other_step(self, opt: torch.optim.Optimizer) -> None:
        """An optimizer other than the primary steps: the layers whose weights it holds
        that have a gradient now (a GAN's generator gets its gradient after the step's
        close, at its own step)."""
        layer_of = self._layer_of
        for g in opt.param_groups:
            for p in g["params"]:
                i = layer_of.get(id(p))
                if i is not None and p.grad is not None:
                    self._graded.add(i)

    def cut(self, models: Models, grad_norm: np.ndarray, backward_ran: bool,
            every_weight: bool = False,
            reaches: Callable[[list[int]], list[bool | None]] | None = None
            ) -> np.ndarray | None:
        """The step's `grad_cut` per layer (`CUT`, `MODEL_CUT`, `UNUSED`, `DETACHED`,
        `FROZEN`; 0 for the other layers with weights an optimizer holds, NaN for the
        rest), from the step's gradient norms (NaN: no gradient) and the layers that had
        one at another optimizer's step; None where it cannot be told (no backward, no
        optimizer, or no layer had a gradient: `no_gradients`). Only layers without a
        gradient are looked at, one by one. `every_weight`: every watched weight has a
        gradient this step, so no layer lacks one (the usual step, told without reading
        the norms). `reaches`: whether the outputs of the given layers make the model's
        output what it is (`replay.Replay.reaches`), asked once per layer that would be
        `UNUSED` (`REACH_TESTS` at a step at most; up to `REACH_TRIES` steps where it
        cannot tell): where it does, it is `DETACHED`."""
        graded, self._graded = self._graded, set()
        n = len(grad_norm)
        if not backward_ran or not self._opts or len(self._base) != n:
            return None
        held = self._cut_base
        if every_weight:
            return held
        missing = np.isnan(grad_norm) & (held == 0)
        if not missing.any():
            return held
        has = ~np.isnan(grad_norm)
        for i in graded:
            has[i] = True
        if not has.any():
            return None
        out = held.copy()
        untold: list[int] = []  # layers that would be `UNUSED`, not yet replayed changed
        for i in np.flatnonzero(missing).tolist():
            if i in graded:
                continue
            if not any(p.requires_grad for p in self._held_by_layer.get(i, ())):
                out[i] = FROZEN
                continue
            mates = has & (self._root_of == self._root_of[i])
            if not mates.any():
                out[i] = MODEL_CUT
            elif i < int(np.argmax(mates)):
                out[i] = CUT
            else:
                out[i] = DETACHED if self._reach.get(i) else UNUSED
                if i not in self._reach:
                    untold.append(i)
        if untold and reaches is not None:
            untold = untold[:REACH_TESTS]
            for i, used in zip(untold, reaches(untold)):
                tries = self._tries[i] = self._tries.get(i, 0) + 1
                if used is not None or tries >= REACH_TRIES:
                    self._reach[i] = used
                if used:
                    out[i] = DETACHED
        return out

    def _refresh(self, models: Models, n: int) -> None:
        params = models.params()
        opts = list(self._opts)
        key = (models.version, n, tuple((id(o), tuple(len(g["params"]) for g in o.param_groups))
                                     for o in opts))
        if key == self._key:
            return
        self._key, self._looked, self._asked = key, False, False
        self._reach, self._tries = {}, {}  # (a layer may be another one now)
        held = {id(p) for o in opts for g in o.param_groups for p in g["params"]}
        mine = {id(p) for _, p, _ in params}
        self._unheld = [(p, i) for _, p, i in params if id(p) not in held]
        self._stale = False
        for o in opts:
            theirs = {id(p) for g in o.param_groups for p in g["params"]}
            self._stale |= bool(theirs & mine) and not theirs <= mine
        self._untrained = set()
        for root in models.root_modules:
            ids = {id(p) for p in root.parameters()}
            if not ids & held:
                self._untrained |= ids
        base = np.full(n, math.nan, np.float32)
        for _, _, i in params:
            base[i] = 0.0
        self._base = base
        self._layer_of = {id(p): i for _, p, i in params if id(p) in held}
        self._held_by_layer = {}
        for _, p, i in params:
            if id(p) in held:
                self._held_by_layer.setdefault(i, []).append(p)
        cut_base = np.full(n, math.nan, np.float32)
        cut_base[list(self._held_by_layer)] = 0.0
        self._cut_base = cut_base
        root_of = np.full(n, -1, np.int64)
        for r, root in enumerate(models.root_modules):
            for p in root.parameters():
                layer = self._layer_of.get(id(p))
                if layer is not None:
                    root_of[layer] = r
        self._root_of = root_of
