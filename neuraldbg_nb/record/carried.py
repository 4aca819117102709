"""Gradients not zeroed: does each step's backward start on the last step's gradients?

A loop without `zero_grad` adds every batch's gradient to all the earlier ones. It is
told from values, not from the version counter: a loop that clips (`clip_grad_norm_`)
or unscales (`GradScaler.unscale_`) its gradients in place moves the version once more,
as `zero_grad(set_to_none=False)` does; and a backward that adds nothing to a weight (a
GAN's critic's, when only its generator is watched) moves it once less. One weight's
gradient stands for all, since a loop zeroes all of them or none (`witness`).
"""

from __future__ import annotations

import math
import weakref

import torch
from torch import nn

from ..trace.columns import REAPPLIED
from . import reductions


class CarryCheck:
    """Reads the witness weight's gradient as each backward starts, and judges at the
    step boundary whether the step's gradients were the last step's (`judge`)."""

    def __init__(self) -> None:
        # the gradient read at the last step boundary, its version then, and its weight
        self._last: tuple[weakref.ref[torch.Tensor], int,
                          weakref.ref[nn.Parameter]] | None = None
        # the weight whose gradient is read, and the optimizer it was chosen for
        self._witness: tuple[weakref.ref[nn.Parameter],
                             weakref.ref[torch.optim.Optimizer] | None] | None = None
        # per backward of this step that started on the last step's gradient: its norm
        # then (a position in the step's transfer)
        self._starts: list[int] = []

    def at_backward(self, sc: reductions.Scalars) -> None:
        """A backward starts: where the weight still holds the gradient read at the last
        boundary, its norm now is queued on `sc` (zero if it was zeroed in place)."""
        if self._last is None:
            return
        g, p = self._last[0](), self._last[2]()
        if g is not None and p is not None and p.grad is g and g.layout == torch.strided:
            self._starts.append(sc.add(torch.linalg.vector_norm(
                g.detach(), dtype=torch.float32 if g.element_size() < 4 else None)))

    def witness(self, opt: torch.optim.Optimizer | None,
                params: list[tuple[str, nn.Parameter, int]]) -> nn.Parameter | None:
        """The weight whose gradient stands for all: the smallest with a gradient (its
        norm is read as each backward starts) of those the stepping optimizer trains, or
        of the watched ones (`params`) for a step closed by hand. Not any watched weight:
        a model done training keeps its last gradients, which no later backward touches.
        Kept while it has a gradient and the same optimizer steps."""
        if self._witness is not None:
            p, chosen_for = self._witness[0](), self._witness[1]
            if (chosen_for() if chosen_for is not None else None) is opt and p is not None \
                    and p.grad is not None:
                return p
        pool = [q for g in opt.param_groups for q in g["params"]] if opt is not None \
            else [q for _, q, _ in params]
        p = min((q for q in pool if q.grad is not None), key=lambda q: q.numel(), default=None)
        self._witness = None if p is None else \
            (weakref.ref(p), weakref.ref(opt) if opt is not None else None)
        return p

    def judge(self, p: nn.Parameter | None, v: list[float], backwards: int) -> float:
        """At the step boundary, after the transfer `v`: 1.0 where the step's gradients
        still hold the last step's (`p`'s gradient is the tensor read at the last
        boundary, and every one of the step's `backwards` started on it while it still
        held values, so nothing zeroed it; `zero_grad(set_to_none=True)`, the default,
        gives a new tensor); 0.0 where they are fresh; `REAPPLIED` where no backward was
        heard and the gradient is the last step's, unchanged since (not even clipped);
        NaN where it cannot be told (no gradient; no backward heard, and gradients set by
        hand). A sparse gradient, whose values are not read, is judged by its version:
        moved by exactly the step's backwards."""
        last, self._last = self._last, None
        if p is None or p.grad is None:
            return math.nan
        g = p.grad
        self._last = (weakref.ref(g), g._version, weakref.ref(p))
        if last is None:
            return math.nan
        if not backwards:
            return REAPPLIED if last[0]() is g and g._version == last[1] else math.nan
        if last[0]() is not g:
            return 0.0
        if g.layout != torch.strided:
            return float(g._version - last[1] == backwards)
        starts = self._starts
        return float(len(starts) == backwards and all(v[i] != 0 for i in starts))

    def new_step(self) -> None:
        """The step's transfer was taken: the norms queued for it are read."""
        self._starts = []


class _Stepped:
    """One other optimizer's last step, and the backwards since (`OtherCarries`)."""

    def __init__(self, p: nn.Parameter, g: torch.Tensor, heard: int) -> None:
        self.p = weakref.ref(p)
        self.g = weakref.ref(g)
        self.version = g._version
        self.heard = heard
        self.host: list[float] = []  # norms at backward starts, read at an earlier transfer
        self.queued: list[int] = []  # ... and queued on this step's transfer


class OtherCarries:
    """The same checks for every optimizer other than the one that closes the steps (a
    GAN's generator's): at each of its steps, were its gradients still the ones its last
    step applied (never zeroed), or applied again with no backward (a step taken twice)?
    Its witness's gradient is read as each backward starts, as `CarryCheck` reads the
    primary's; an optimizer steps between two transfers, so its verdict is given at the
    next step boundary (`resolve`), into that step's row."""

    def __init__(self) -> None:
        self._last: weakref.WeakKeyDictionary[torch.optim.Optimizer, _Stepped] = \
            weakref.WeakKeyDictionary()
        self._pending: list[tuple[int, list[float], list[int]]] = []
        self._verdict = math.nan  # given at a step before the transfer, by host facts alone

    def at_backward(self, sc: reductions.Scalars) -> None:
        """A backward starts: each optimizer's witness still holding the gradient its last
        step applied has that gradient's norm queued."""
        for s in self._last.values():
            g, p = s.g(), s.p()
            if g is not None and p is not None and p.grad is g and g.layout == torch.strided:
                s.queued.append(sc.add(torch.linalg.vector_norm(
                    g.detach(), dtype=torch.float32 if g.element_size() < 4 else None)))

    def at_step(self, opt: torch.optim.Optimizer, heard: int) -> None:
        """`opt`, not the primary, starts a step; `heard`: backwards heard in the watch so
        far."""
        pool = [q for g in opt.param_groups for q in g["params"] if q.grad is not None]
        p = min(pool, key=lambda q: q.numel(), default=None)
        last = self._last.pop(opt, None)
        g = p.grad if p is not None else None
        if p is None or g is None:
            return
        if last is not None:
            same = last.p() is p and last.g() is g
            backwards = heard - last.heard
            if not same:
                self._verdict = max(_finite(self._verdict), 0.0)
            elif not backwards:
                if g._version == last.version:
                    self._verdict = max(_finite(self._verdict), REAPPLIED)
            elif g.layout == torch.strided:
                self._pending.append((backwards, last.host, last.queued))
        self._last[opt] = _Stepped(p, g, heard)

    def resolve(self, v: list[float]) -> float:
        """After the transfer `v`: the worst verdict on the other optimizers' steps since
        the last boundary: `REAPPLIED` (a step taken twice), 1.0 (gradients not zeroed: each
        backward since its last step started on the gradient it applied, still holding
        values), 0.0 (zeroed), NaN where no other optimizer stepped or it cannot be told."""
        verdict, self._verdict = self._verdict, math.nan
        for backwards, host, queued in self._pending:
            starts = host + [v[i] for i in queued]
            carried = float(len(starts) == backwards and all(x != 0 for x in starts))
            verdict = max(_finite(verdict), carried) if verdict != REAPPLIED else verdict
        self._pending = []
        for s in self._last.values():
            s.host += [v[i] for i in s.queued]
            s.queued = []
        return verdict


def _finite(x: float) -> float:
    return -1.0 if math.isnan(x) else x
