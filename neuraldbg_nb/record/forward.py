"""The forward pass: which calls are recorded, and each layer's output summarised.

Each layer's forward hook (`Forward.post`) takes its output's min and max every step (read
on the host at once on the CPU, else kept on the device until the step closes) and, on
sampled steps, its full statistics (`reductions.rich_activation`, a row of
`reductions.RichBatch`, or a large one's sample: `reductions.sampled_activation`); it
holds the layer's input and output for capture where they are worth holding (`_unusual`).
The models' calls (their roots' hooks: `enter_call`, `leave_call`) say which forwards
train: calls with gradients off, compiled ones and those inside `torch.func` transforms
are left out, and said (`eval_seen`, `compiled_seen`, `transformed_seen`).

The layer hook runs on every layer call and its time is the engine's largest steady cost:
what it reads is kept in attributes of its own object (the models' containers by
reference, the step's lists, its time counters), never through another object.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from . import reductions, step_row
from .discovery import Candidate, Models
from .guard import guarded
from .layers import first_tensor, storage_at, tensors_in
from .timing import clock as _clock

_is_compiling = torch.compiler.is_compiling  # read on every layer call: one lookup saved
_transformed = torch._C._are_functorch_transforms_active
_tracing = torch._C._is_tracing
"""`torch.jit.trace` is running the model: a hook's ops would enter the traced graph, so
the hooks do nothing then (the trace is the user's artifact, not a training step)."""
_is_exporting = torch.compiler.is_exporting
"""`torch.export` is tracing the model (under `_is_compiling` too): as for `_tracing`, and
it is no compiled training whose activations go unwatched."""
"""Inside `torch.func` transforms (`vmap`, `grad`, `jvp`: per-sample gradients, Jacobians)
the tensors a hook sees are wrapped: reading one on the host (`.item()`) or copying into
it raises. Calls made there are left out (`transformed_seen`), as compiled ones are."""
_grad_enabled = torch.is_grad_enabled
"""A model called with gradients off (`torch.no_grad()`, `torch.inference_mode()`) trains
nothing: an evaluation pass inside the training loop, a frozen teacher making targets.
Such calls are left out: recorded, their batches and activations would join the next
training step's, and a validation set scaled unlike the training set would read as a jump
of every layer at that step. What decides is the model's call, not the layer's: a frozen
backbone run under `no_grad` inside a forward that trains (or a checkpointed segment) is
recorded."""

Held = dict[int, tuple[torch.Tensor | None, torch.Tensor]]
"""Layer index -> the (input, output) of its last call in the step, held for capture."""


class Forward:
    """The forward hooks of one watch, and what they recorded of the step so far."""

    def __init__(self, models: Models, sc: reductions.Scalars, *, hold: bool,
                 hold_jump: float, found: Callable[[nn.Module, tuple], None],
                 fail: Callable[[Exception, str], None]) -> None:
        """`hold`: hold layers' inputs and outputs for capture. `hold_jump`: the abs-max
        move that makes a CPU activation worth holding (`_unusual`). `found`: told of a
        model first called when none was given (`pre`), before its call goes on. `fail`:
        told of an error in a hook (`guarded`)."""
        self.trace = models.trace
        self._roots = models.roots
        self._cand = models.candidates
        self._index = models.index
        self._layer = models.layer
        self._sc = sc
        self._hold = hold
        self._hold_jump = hold_jump
        self._found = found
        self._fail = fail
        self.failed = False
        """A hook of the probe failed: these hooks return at once from then on."""
        self.hook_s = 0.0
        """The layer hooks' per-call checks this step (seconds; `timing.StepTimer`)."""
        self.rich_s = 0.0
        """The full statistics this step (seconds; `timing.StepTimer`)."""
        self.calls = 0
        """Layer calls recorded this step, replays included (`timing.StepTimer` charges
        PyTorch's cost of calling their hooks)."""
        self.compiled_seen = False  # a call under torch.compile was left out
        self.transformed_seen = False  # a call inside torch.func transforms was left out
        self.eval_seen = False  # a forward with gradients off was left out
        self.activations_seen = False  # a training forward's activation was recorded
        self._root_depth = 0  # nesting of the watched models' calls in progress
        self._eval_call = False  # the model's call in progress began with gradients off
        self.outside: set[int] = set()
        """Ids of the layers that a training call reached outside every call of a watched
        model: the loop trains the model through its parts (`Probe._hook_parts`)."""
        self._batch_rows = reductions.RichBatch()
        self._last_absmax: list[float] = []  # per layer, from the last step
        self._masks: set[int] = set()  # layers whose -inf values are a mask (`step_row`)
        self._called = 0  # layers numbered at the last step boundary
        self._p_mn = self._p_mx = 0  # where the device extremes are in the step's transfer
        self.new_step(sampled=True, hold_all=True)

    def new_step(self, sampled: bool, hold_all: bool) -> None:
        """A step starts: `sampled` gets the full statistics; `hold_all` holds every
        layer's tensors for capture (sampled and reference steps)."""
        self._sampled = sampled
        self._hold_all = hold_all
        self.calls += len(getattr(self, "_c_idx", ()))  # the step's calls so far
        self._c_idx: list[int] = []
        self._c_mn: list[float] = []  # NaN where the value is on a device (below)
        self._c_mx: list[float] = []
        self._c_dev: list[int] = []  # positions in the lists above of device values
        self._d_mn: list[torch.Tensor] = []
        self._d_mx: list[torch.Tensor] = []
        # the last output reduced, its version then, its min and max: see `_known`
        self._last: tuple[weakref.ref[torch.Tensor] | None, int, Any, Any] = (
            None, -1, math.nan, math.nan)
        self._last_c: Candidate | None = None  # the layer whose output `_last` is
        self._rich: list[tuple[int, ...]] = []  # layer, numel, rich_activation's positions
        self._rich_rows: list[tuple[int, int, tuple[Any, ...], int]] = []  # idx, numel, group, row
        self._batch_rows.clear()
        self.held: Held = {}
        self._measured: set[int] = set()  # weightless layers measured in this forward

    @property
    def pending(self) -> bool:
        """A layer's output was recorded since the step began."""
        return bool(self._c_idx)

    # -- the models' calls ------------------------------------------------------------
    @guarded
    def pre(self, module: nn.Module, args: tuple) -> None:
        """The global forward pre-hook, installed where no model was given: a module with
        weights first called outside every watched model's call is a model (`found`)."""
        if _is_compiling():
            self.compiled_seen = self.compiled_seen or not _is_exporting()
            return
        if _transformed():
            self.transformed_seen = True
            return
        if _tracing():
            return
        mid = id(module)
        if not _grad_enabled():  # a model seen only in evaluation is not discovered
            self.eval_seen = True
        elif mid not in self._roots and self._root_depth == 0 and mid not in self._cand \
                and next(module.parameters(), None) is not None:
            self._found(module, args)  # its hooks hear this call already
        if mid in self._cand and mid not in self._index and not self._cand[mid].composite:
            self._layer(mid)  # (a composite is numbered at its output: after its children)

    def enter_call(self) -> bool:
        """A watched model's call begins (its root's pre-hook): True where it is a top-level
        call that trains, whose input batch is recorded."""
        top = self._root_depth == 0
        if top:
            self._measured.clear()  # (a forward of its own: a micro-batch's, a second input's)
            transformed = _transformed()
            # a trace or an export of the model (or a compiled function that calls it):
            # its ops would enter the graph, and it is no training step
            traced = _tracing() or _is_compiling()
            self._eval_call = transformed or traced or not _grad_enabled()
            if transformed:  # (`_transformed`)
                self.transformed_seen = True
            elif self._eval_call and not traced:
                self.eval_seen = True
        self._root_depth += 1
        return top and not self._eval_call

    def leave_call(self, output: object, whole: bool = True) -> bool:
        """A watched model's call ends (its root's post-hook, on errors too): True where a
        top-level call that trains ended, with `output` the model's (`whole`; a part's
        call, `Probe._hook_parts`, returns no output of the model's)."""
        self._root_depth = max(0, self._root_depth - 1)
        if self._root_depth:
            return False
        trained = not self._eval_call
        if trained and whole:
            self._model_output(output)
        self._eval_call = False
        return trained

    def replaying(self, on: bool) -> None:
        """A replay of the step's forward (`replay.Replay`) begins or ends: its calls,
        made under `torch.no_grad()` with the root's hooks quiet, are recorded as a
        training call's."""
        self._root_depth = 1 if on else 0
        self._eval_call = False
        self._measured.clear()

    def end_calls(self) -> None:
        """The block ends: no call is in progress any more (a forward that raised half
        way never ran its post-hooks)."""
        self._root_depth = 0
        self._eval_call = False

    # -- each layer's call --------------------------------------------------------------
    @guarded
    def post(self, c: Candidate, module: nn.Module, args: tuple, output: object) -> None:
        """A layer's forward hook: the cheap path (min and max: read at once on the host,
        kept on the device until the step closes elsewhere), and the rich statistics on
        sampled steps. It runs on every layer call, so it is kept to a few attribute
        reads around one reduction (none for a ReLU fed by the layer just reduced, nor
        for a layer returning the very output just reduced: a model with parameters of
        its own returning its last layer's output, an identity)."""
        if _is_compiling():
            self.compiled_seen = self.compiled_seen or not _is_exporting()
            return
        if _transformed():
            self.transformed_seen = True
            return
        if self._eval_call or (not self._root_depth and not _grad_enabled()):
            self.eval_seen = True  # an evaluation (see `_grad_enabled`)
            if c.index < 0 and not c.composite:  # its place in forward order all the
                self._layer(id(module))  # same (checkpointing a whole model runs its first
            return  # call without them)
        if not self._root_depth:
            self.outside.add(id(module))
        y = output if type(output) is torch.Tensor else first_tensor(output)
        if y is None or not y.is_floating_point():
            return
        t_in = _clock()
        if y.layout != torch.strided:  # sparse: its stored values (see `reductions.stored_values`)
            y = reductions.stored_values(y.detach())
        numel = y.numel()
        if numel == 0:
            return  # its check's time, a few attribute reads, is not counted
        if c.composite and c.index < 0 and (y.dim() == 0 or (
                c.root and self._known(y, 0) is not None)):
            return  # a loss first (a transformers model given labels), or a model that so
            # far returns its last layer's output: no layer (`layers.composite`)
        idx = c.index if c.index >= 0 else self._layer(id(module))
        if c.weightless:  # a module without weights that a forward calls again (one
            if idx in self._measured:  # ReLU after each of a block's convolutions) is
                return  # measured at its first call, its place in forward order: its
            self._measured.add(idx)  # later calls pass on what the layers before made
        if numel < c.fewest:
            c.fewest = numel
            self.trace.update_layer(idx, outputs=numel)
        x = args[0] if args and type(args[0]) is torch.Tensor and args[0].is_floating_point() \
            else first_tensor(args)
        known = self._known(output, 0) if type(output) is torch.Tensor else None
        if known is None and c.relu and x is not None:
            known = self._derived(x, bool(module.inplace))
        y = y.detach()
        mn: Any
        mx: Any
        if known is not None:
            mn, mx = known
        elif c.nonneg:  # the max is the abs-max and shows any NaN: half the cost of min_max
            mn = mx = y.amax()
        else:
            mn, mx = reductions.min_max(y)
        host = reductions.on_host(y)
        if host:  # two floats now instead of two tensors to stack, move and free later
            if type(mx) is not float:
                mn, mx = mn.item(), mx.item()
            last = (mn, mx)
        else:
            self._c_dev.append(len(self._c_idx))
            self._d_mn.append(mn)
            self._d_mx.append(mx)
            last, mn, mx = (mn, mx), math.nan, math.nan
        self._c_idx.append(idx)
        self._c_mn.append(mn)
        self._c_mx.append(mx)
        if type(output) is torch.Tensor and not output.is_inference():  # no version there
            self._last = (weakref.ref(output), output._version, *last)
            self._last_c = c
        if self._sampled:
            t0 = _clock()
            finite = host and math.isfinite(mn) and math.isfinite(mx)
            row = self._batch_rows.add(y, c.role, c.bounds, c.nonneg) \
                if finite and numel * y.element_size() <= reductions.BATCH_ROW_BYTES else None
            if row is not None:  # its statistics are taken with its group's at the close
                self._rich_rows.append((idx, numel, *row))
            else:  # a large one known finite from its sample, else from every element
                got = reductions.sampled_activation(y, c.role, c.bounds, self._sc, c.nonneg) \
                    if finite else None
                if got is None:
                    got = (numel, *reductions.rich_activation(
                        y, c.role, c.bounds, self._sc, finite=finite, nonneg=c.nonneg))
                self._rich.append((idx, *got))
            spent = _clock() - t0
            self.rich_s += spent
            t_in += spent  # the per-step checks' time goes on without it
        if self._hold and (self._hold_all or not host or self._unusual(idx, mn, mx)):
            self.held[idx] = (x, y)  # the capture store detaches them
        self.hook_s += _clock() - t_in

    def _model_output(self, output: object) -> None:
        """A bounded activation whose output is the model's (a classifier's final
        sigmoid) is not judged for saturation: a confident model's output is at its bounds
        by design, and healthy binary classifiers would be warned of. Its role becomes
        "other" (the detectors read roles from the trace), from the first call on. The
        model may return it reshaped (`.squeeze(1)`, `.view(-1, 1, 28, 28)`): a view of all
        of its values is its output too; and beside other outputs (a detector's `(boxes,
        objectness)`, a model returning `(features, probability)`)."""
        ref, c = self._last[0], self._last_c
        if c is None or c.role != "bounded" or ref is None:
            return
        last = ref()
        if last is None:
            return
        for out in [output] if type(output) is torch.Tensor else tensors_in(output):
            if out is last or (out.numel() == last.numel() and out.storage_offset() ==
                               last.storage_offset() and storage_at(out) == storage_at(last) != 0):
                c.role, c.bounds = "other", None
                self.trace.update_layer(c.index, role="other")  # numbered by its hook
                return

    def _known(self, t: torch.Tensor, bumps: int) -> tuple[Any, Any] | None:
        """(min, max) of `t` (floats on the host, else device tensors) where it is the
        output the last hook reduced, changed since only by `bumps` in-place ops that
        are known (an in-place ReLU's own); None otherwise."""
        ref, version, mn, mx = self._last
        if ref is None or ref() is not t or t._version != version + bumps:
            return None
        return mn, mx

    def _derived(self, x: torch.Tensor, inplace: bool) -> tuple[Any, Any] | None:
        """A ReLU's (max, max) from its input's, where its input is known (`_known`):
        max(relu(x)) = max(max(x), 0), NaN kept; its max is also its abs-max."""
        known = self._known(x, inplace)
        if known is None:
            return None
        mx = known[1]
        if isinstance(mx, torch.Tensor):
            mx = mx.clamp_min(0.0)  # clamp keeps NaN
        elif mx < 0.0:  # a NaN stays NaN
            mx = 0.0
        return mx, mx

    def _unusual(self, idx: int, mn: float, mx: float) -> bool:
        """Is a CPU activation worth holding for capture at a quiet step? When it is
        non-finite or its abs-max moved by `hold_jump` or more since the last step (the
        same test that wakes detection). Sampled steps (dead units and saturation are
        judged there) and reference steps hold them all, and so do accelerators (deciding
        would need a transfer). An event on a layer that looked normal (a gradient one)
        at a quiet step is then captured without its input and output.

        Holding a layer's input and output until the step closes keeps memory alive that
        the forward and backward would otherwise reuse, so the allocator hands out fresh
        memory every step: large activations held every step cost a conv net 5-10% of its
        step time that way (fresh pages), and small ones cost a 100-layer MLP 4%
        (`benchmarks/compare.py`: 200 blocks of 64 KB a step, released cold at the
        close)."""
        if mn == -math.inf and idx in self._masks:
            mn = mx  # its mask (`step_row.masking`)
        now = max(abs(mn), abs(mx))  # a NaN is in both
        before = self._last_absmax[idx] if idx < len(self._last_absmax) else math.nan
        if now == before:
            return False
        return not (math.isfinite(now) and before > 0
                    and before / self._hold_jump < now < before * self._hold_jump)

    # -- the step boundary ----------------------------------------------------------------
    def queue(self) -> None:
        """Before the step's transfer: the extremes kept on a device, and the batched rows'
        statistics (`reductions.RichBatch`), queued on the step's `Scalars`."""
        sc = self._sc
        self._p_mn, self._p_mx = sc.extend(self._d_mn), sc.extend(self._d_mx)
        if self._rich_rows:
            self.reduce_rows()

    def reduce_rows(self) -> None:
        """The batched rows' statistics, as `_rich` entries (see `reductions.RichBatch`)."""
        t0 = _clock()
        first = self._batch_rows.reduce(self._sc)
        for idx, numel, key, r in self._rich_rows:
            *pos, units, counted = first[key]
            self._rich.append((idx, numel, *(p + r if p >= 0 else -1 for p in pos),
                               units, counted))
        self.rich_s += _clock() - t0

    def columns(self, v: list[float], n: int) -> dict[str, np.ndarray]:
        """After the transfer `v`: the step's activation columns for `n` layers (the
        abs-max every step, the full statistics on sampled ones)."""
        mins, maxs = self._c_mn, self._c_mx  # new with each step: filled in place
        if self._c_dev:
            k = len(self._c_dev)
            p_mn, p_mx = self._p_mn, self._p_mx
            for j, lo, hi in zip(self._c_dev, v[p_mn:p_mn + k], v[p_mx:p_mx + k]):
                mins[j], maxs[j] = lo, hi
        if n > self._called:  # layers first called in this step: a mask of -inf by design?
            self._masks |= step_row.masking(self._c_idx, mins, maxs, self._called)
            self._called = n
        if not self._c_idx:  # a step whose layers were not hooked keeps the last levels
            return {"act_absmax": np.full(n, math.nan, np.float32)}
        row = {"act_absmax": step_row.absmax(self._c_idx, mins, maxs, n, self._masks)}
        self.activations_seen = True
        self._last_absmax = row["act_absmax"].tolist()
        if self._rich:
            row.update(step_row.rich_columns(self._rich, v, n))
        return row

    def release(self) -> None:
        """Drop what is held (the watch ends or failed)."""
        self.held.clear()
        self._batch_rows.release()
