"""Closing a step: its numbers, queued on the device while it ran, go to the host in one
transfer and become one trace row.

What the step's parts queued (the layers' extremes and statistics, the input batches, the
losses, the last update's weight slices) is joined by the gradients' norms, read here, and
the learning rate; one `Scalars.to_host` brings them all back, and each part reads its own
numbers out of it into the row (`step_row`). The last update's weight norms go into the
row of the step it ended, one step late (`WeightProbe.record`). Then the watch is told
(`on_step`: detection, captures), and the next step's sampling is decided.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ..trace.columns import HOOK_GAP, ZEROED, Trace
from . import reductions, step_row
from .backward import Backwards
from .discovery import Candidate, Models
from .forward import Forward, Held
from .inputs import Inputs
from .optimizer import learning_rate, missing_gradients
from .replay import RECENT, Recent, Replay, anomalous, edited, grad_total, gradient_cut, lr_moved
from .sampler import is_reference_step
from .step_owner import StepOwner
from .timing import StepTimer, clock
from .weights import WeightProbe


@dataclass
class StepRecord:
    """What a closed step hands on: its index and live references for capture.

    `refs` maps a layer index to the (input, output) of its last call in the step; they
    are valid only during the callback (the probe drops them right after).
    """

    step: int
    refs: Held = field(default_factory=dict)
    batch: torch.Tensor | None = None
    params: list[tuple[str, nn.Parameter, int]] = field(default_factory=list)


class Boundary:
    """The step boundary of one watch, and the step's sampling decision."""

    def __init__(self, trace: Trace, models: Models, forward: Forward, inputs: Inputs,
                 backwards: Backwards, weights: WeightProbe, steps: StepOwner,
                 sc: reductions.Scalars, timer: StepTimer,
                 on_step: Callable[[StepRecord], None], *, replay: Replay | None = None,
                 set_hooks: Callable[[bool], None] | None = None,
                 hook_layers: Callable[[list[Candidate]], None] | None = None,
                 hook_parts: Callable[[], None] | None = None) -> None:
        """`set_hooks`: turns the layer hooks on or off for the next forward, where they
        are on only for sampled and reference steps, the step after a learning rate's move
        (`replay.lr_moved`), and a step `HOOK_GAP` after the last hooked one where the
        sampling leaves a longer gap (their abs-max alone: each layer's recent level,
        counted in measured steps, is known where a jump is judged); None: on every step.
        `replay`: the step's calls, replayed with the hooks on where the step was not
        hooked and its every-step numbers say it went wrong (`replay.anomalous`).
        `hook_layers`: hooks layers the loop put into a model inside the watch
        (`Models.rescan`) where the layer hooks are on. `hook_parts`: after a step whose
        model calls were not heard, so that the parts of the model the loop calls are
        heard from the next step on (`Probe._hook_parts`)."""
        self._trace = trace
        self._models = models
        self._forward = forward
        self._inputs = inputs
        self._backwards = backwards
        self._weights = weights
        self._steps = steps
        self._sc = sc
        self._timer = timer
        self._on_step = on_step
        self._replay = replay
        self._set_hooks = set_hooks
        self._hook_layers = hook_layers
        self._hook_parts = hook_parts
        self._rescans = Rescans()
        self._recent = Recent()  # the last steps' numbers, for `_went_wrong`
        self._norm_plan = reductions.NormPlan()  # how the gradients are normed
        self.zeroed_before_step = False
        """A step closed by hand found every gradient zeroed (`close`)."""
        self._hook_next = False  # the next forward is hooked (a learning rate moved)
        self._last_hooked = 0  # the last step whose layers were measured (hooked, replayed)
        self.hooked = True
        """The layer hooks are on for the step in progress."""
        self.sampled = True
        """The step in progress gets the full statistics."""
        self.replayable = False
        """The step last closed had its model's calls heard (`Replay.record`: the model's,
        or its parts' where the loop calls those), so a step of the loop that goes wrong
        can be replayed."""
        self.new_step()

    def new_step(self) -> None:
        """The parts start a step: sampled ones (and reference steps) hold every layer's
        tensors for capture."""
        sampled = self.sampled
        hold_all = sampled or is_reference_step(self._trace.n_steps)
        self._forward.new_step(sampled, hold_all)
        self._inputs.new_step(sampled)
        self._backwards.new_step(sampled)
        if self._replay is not None:
            self._replay.new_step()
        if self._set_hooks is not None:
            step = self._trace.n_steps
            self.hooked = hold_all or self._hook_next or step - self._last_hooked >= HOOK_GAP
            if self.hooked:
                self._last_hooked = step
            self._hook_next = False
            self._set_hooks(self.hooked)

    def hook_closure(self) -> None:
        """A step given a closure (`optimizer.step(closure)`) begins, whose forward cannot
        be replayed: its layers are hooked as it runs. It closes after the update where
        the optimizer may call the closure more than once (`optimizer.calls_closure_once`),
        when the weights its forward used are gone; or no call of the model was heard in
        the step before (`replayable`: the first step, or a loop that calls parts of the
        model whose hooks come at that step's end, `hook_parts`)."""
        if self._set_hooks is not None and not self.hooked:
            self.hooked = True
            self._last_hooked = self._trace.n_steps
            self._set_hooks(True)

    @property
    def backwards(self) -> Backwards:
        """The step's backwards (the other optimizers' checks are theirs)."""
        return self._backwards

    @property
    def pending(self) -> bool:
        """Something was recorded since the last step boundary."""
        return self._forward.pending or self._backwards.pending or self._inputs.pending

    def close(self, opt: torch.optim.Optimizer | None, updated: bool = False) -> None:
        """The step boundary (`opt`: the primary optimizer, None for a step ended by hand):
        the step's numbers go to the host in one transfer and become one trace row, with
        the last update's weights (`WeightProbe`), how far they moved since, outside the
        optimizer (`w_edited`: where `opt` is about to update them; not for a step ended
        by hand, whose loop updates the weights itself, nor one closed after its update,
        `updated`, as a step given a closure may be) and whether the gradients were zeroed
        (`CarryCheck`); then `on_step` (detection, capture) and the next step's sampling
        decision."""
        t_enter = clock()
        sc, trace = self._sc, self._trace
        params = self._models.params()
        # a step closed by hand in which no backward ran (a block that only evaluates):
        # whatever `.grad` holds is from before, not this step's
        stale = opt is None and not self._backwards.any_heard
        with_grad = [] if stale else _with_grad(params)
        step = trace.n_steps
        replaced = False
        membership = self._steps.membership
        anew, membership.new_optimizer = membership.new_optimizer, False
        fresh, membership.fresh_optimizer = membership.fresh_optimizer, False
        if self._rescans.due(step, len(with_grad), anew):
            version = self._models.version
            new = self._models.rescan()
            if new and self._hook_layers is not None:
                self._hook_layers(new)
            replaced = self._models.version != version
            self._rescans.found(step, replaced)
            if replaced:
                params = self._models.params()
                with_grad = [] if stale else _with_grad(params)
            self._rescans.graded = len(with_grad)
        g_pos = reductions.grouped_norms([g for g, _ in with_grad], sc, self._norm_plan)
        missing = missing_gradients(opt, self._backwards.any_heard, bool(with_grad), params)
        # the last update's weight norms (`WeightProbe`) go into the last row, in one
        # pass with this step's gradient norms and the weights' moves since that update
        # (weights replaced since: the last update's copies are of other tensors)
        if step > 0 and not replaced:
            weight_parts, edits = self._weights.queue(sc, opt is not None and not updated)
        else:
            weight_parts, edits = self._weights.drop(), None
        self._forward.queue()
        lr_host, lr_pos = learning_rate(opt, sc)
        t_x = clock()
        v = sc.to_host()  # the step's one device-to-host transfer
        if sc.from_device:  # it waited for the device work queued before it, mostly the
            self._timer.other_s -= clock() - t_x  # training's: not the engine's time

        n = trace.n_layers
        row: dict[str, np.ndarray] = self._forward.columns(v, n)
        norms = step_row.layer_norms(v, [(g_pos, [i for _, i in with_grad]), *weight_parts], n)
        row["grad_norm"] = norms[0]
        # every gradient exactly 0 after a backward (the test stops at the first that is
        # not 0: at once, in a step that trains)
        if with_grad and self._backwards.any_heard and all(v[p] == 0.0 for p in g_pos):
            if opt is None:  # a step closed by hand after the loop zeroed them in place
                # (`p.grad.zero_()` after its update): not measured, rather than 0
                row["grad_norm"] = np.full(n, math.nan, np.float32)
                self.zeroed_before_step = True
            elif missing == 0.0:  # at the optimizer's step: none can move a weight
                missing = ZEROED
        unheld = None if opt is None or self._steps.input_trained else \
            self._steps.membership.column(self._models, n)
        if unheld is not None:  # (`Membership`: weights with gradients no optimizer holds)
            row["grad_unheld"] = unheld
            cut = self._steps.membership.cut(self._models, norms[0], self._backwards.any_heard,
                                             every_weight=len(with_grad) == len(params),
                                             reaches=functools.partial(self._reaches, norms[0]))
            if cut is not None:  # (held weights that got no gradient)
                row["grad_cut"] = cut
        self._weights.record(trace, step - 1, norms[1:1 + len(weight_parts)], v)
        edited_by = None
        if edits is not None:  # (`w_edited`: the moves over the norms the last update left)
            edited_by = edits.factors(v, sc, n)
            row["w_edited"] = np.array(edited_by, np.float32)

        eval_layers = self._backwards.eval_layers
        scalars = {"lr": v[lr_pos] if lr_pos >= 0 else lr_host,
                   "loss": self._backwards.loss(v),
                   "sampled": float(self.sampled),
                   "eval_layers": eval_layers if eval_layers >= 0 else math.nan,
                   "grad_carried": self._backwards.carried(opt, params, v),
                   "grads_missing": missing,
                   "opt_fresh": float(fresh),
                   "others_carried": self._backwards.others.resolve(v),
                   **self._backwards.read_form(v)}
        if self._steps.input_trained:  # (`StepOwner.input_trained`)
            self._inputs.drop()
        scalars.update(self._inputs.read(v))
        scalars.update(self._backwards.scales(v))
        scalars["hooked"] = float(self.hooked)
        if self._replay is not None:
            grads = row["grad_norm"].tolist()
            total = grad_total(grads)
            # (norms are never negative: their sum is finite where each one is)
            finite = math.isfinite(sum(map(v.__getitem__, g_pos))) and not (
                self._backwards.any_heard and not math.isfinite(scalars["loss"]))
            if step > 0:
                lr_b = float(trace.scalar("lr", step - 1, step)[0])
                self._hook_next = lr_moved(lr_b, float(scalars["lr"]))
                if not self.hooked and self._went_wrong(step, scalars, grads, total,
                                                        finite, edited_by):
                    replayed = self._replayed(n)
                    if replayed is not None:
                        row.update(replayed)
                        scalars["hooked"] = 1.0
                        self._last_hooked = step
            self._recent.add(step, float(scalars["loss"]), total,
                             float(scalars.get("in_absmax", math.nan)), finite)
        trace.append(row, scalars)

        held = self._forward.held
        record = StepRecord(step, held, self._inputs.batch, params)
        self.replayable = self._replay is not None and bool(self._replay.calls)
        if not self.replayable and self._hook_parts is not None:
            self._hook_parts()
        self.sampled = self._timer.next_sampled(step, self.sampled, t_enter)
        self.new_step()
        try:
            self._on_step(record)
        finally:
            held.clear()
            self._timer.end_interval(step, t_enter)

    def _went_wrong(self, step: int, scalars: dict[str, float], grads: list[float],
                    total: float, finite: bool, edited_by: list[float] | None) -> bool:
        """Whether an unhooked step's every-step numbers say its forward went wrong
        (`replay.anomalous`, `replay.edited`): its loss and its gradients' total norm
        (`total`) against the `RECENT` steps before, each layer's gradient norm (`grads`)
        cut to 0 (`replay.gradient_cut`: the trace is read only where one is 0), its
        input's abs-max against the step before, and the weight norms the last update
        left (written into the trace one step late, so the rows of the two updates before
        this forward). Not where they are not finite (`finite`), nor were the step
        before's: a run that stays non-finite went wrong at its first such step, which was
        replayed, and a replay of each step after it would cost a forward each and find
        nothing new."""
        if not finite and not self._recent.finite_before(step):
            return False
        trace = self._trace
        weights = trace.col("param_norm", step - 2, step).tolist() if step >= 2 else []
        first = max(trace.full_from, step - RECENT)
        losses, totals = self._recent.since(first)
        cut = 0.0 in grads and gradient_cut(grads, trace.col("grad_norm", first, step).tolist())
        if anomalous(
                scalars["loss"], self._backwards.any_heard, finite, total, losses, totals,
                inputs=(self._recent.input_before(step),
                        float(scalars.get("in_absmax", math.nan))),
                weights=(weights[0], weights[1]) if len(weights) == 2 else ([], []),
                cut=cut):
            return True
        return edited_by is not None and edited(edited_by)

    def _reaches(self, grads: np.ndarray, layers: list[int]) -> list[bool | None]:
        """Whether the outputs of `layers` make the model's output what it is
        (`replay.Replay.reaches`), the step's forward replayed with the layer hooks off;
        None for a layer it cannot tell (no replay). Not asked, and None, for a layer
        whose own layers got a gradient (`grads`, the step's norms): its output carries
        one back, so its own weights are left unused (a parameter the forward never
        reads), not detached."""
        replay, forward, candidates = self._replay, self._forward, self._models.candidates
        found = [c for c in candidates.values() if c.index in layers]
        asked = [c for c in found if not any(
            (d := candidates.get(id(m))) is not None and 0 <= d.index < len(grads)
            and not math.isnan(grads[d.index]) for m in c.module.modules() if m is not c.module)]
        if replay is None or not replay.calls or not asked:
            return [None] * len(layers)
        if self._set_hooks is not None:
            self._set_hooks(False)
        evaluated = forward.eval_seen  # (layer hooks left on hear no training call)
        try:
            used = replay.used_outputs(self._backwards.roots)
            told = dict(zip((c.index for c in asked),
                            replay.reaches([c.module for c in asked], used)))
        finally:
            forward.eval_seen = evaluated
            if self._set_hooks is not None:
                self._set_hooks(self.hooked)
        return [told.get(i) for i in layers]

    def _replayed(self, n: int) -> dict[str, np.ndarray] | None:
        """The step's forward replayed with the layer hooks on (`replay.Replay.run`): its
        activation columns, read in a second transfer, or None where it was refused."""
        assert self._replay is not None and self._set_hooks is not None
        forward, set_hooks = self._forward, self._set_hooks
        forward.new_step(False, False)  # the abs-max, and what looks unusual held
        forward.replaying(True)
        try:
            ran = self._replay.run(lambda: set_hooks(True), lambda: set_hooks(False))
        finally:
            forward.replaying(False)
        if not ran:  # what its hooks recorded is not the step's
            forward.new_step(False, False)
            return None
        forward.queue()
        v = self._sc.to_host()
        return forward.columns(v, self._trace.n_layers)

    def flush(self) -> None:
        """At exit: the last update's weight norms go into the last row."""
        if self._weights.flush(self._trace, self._sc):
            self.new_step()


def _with_grad(params: list[tuple[str, nn.Parameter, int]]
               ) -> list[tuple[torch.Tensor, int]]:
    """(gradient, layer) of the watched weights that have one and are trainable: a frozen
    weight's `.grad` is what an earlier training left (a teacher trained, then frozen
    with `requires_grad_(False)`), not this step's."""
    return [(g, idx) for _, p, idx in params if (g := p.grad) is not None and p.requires_grad]


RESCAN_EVERY = 64
"""The models are walked for replaced layers and weights (`Models.rescan`) at least once in
this many steps, and at most this far apart after walks that found nothing."""


class Rescans:
    """When to walk the models for layers and weights the loop replaced inside the watch.

    A replaced weight is one the models no longer hold: the watched one gets no gradient
    from then on (`zero_grad` sets it to None), so fewer watched weights with a gradient
    than at the step before is the sign, read from the list of gradients the boundary
    builds anyway. A walk that finds nothing doubles the wait for the next such sign (a
    GAN's generator sits out every other step), up to `RESCAN_EVERY`; every
    `RESCAN_EVERY`-th step walks anyway (gradients zeroed in place keep their count), and
    so does a step where an optimizer stepped for the first time (`Membership.new_optimizer`:
    one built anew after a layer was replaced, whose `zero_grad` leaves the old layer's
    gradient in place)."""

    def __init__(self) -> None:
        self.graded = 0
        """Watched weights with a gradient at the last step."""
        self._gap = 1
        self._next = 0

    def due(self, step: int, graded: int, new_optimizer: bool = False) -> bool:
        """Whether to walk the models at `step`, where `graded` watched weights have a
        gradient and `new_optimizer` says whether an optimizer first stepped."""
        fewer, self.graded = graded < self.graded, graded
        return step > 0 and (step % RESCAN_EVERY == 0 or new_optimizer
                             or fewer and step >= self._next)

    def found(self, step: int, changed: bool) -> None:
        self._gap = 1 if changed else min(2 * self._gap, RESCAN_EVERY)
        self._next = step + self._gap
