"""Hooks that record one step of training into the trace.

The probe only records: forward hooks summarise each layer's output on the device, the
primary optimizer's step hooks mark step boundaries and read every watched gradient (and,
after the update, every weight: `weight_probe`) with fused norms, and the loss tap hears
the tensor that `backward()` was called on. At the step boundary the step's summaries go
to the host in one transfer and become one trace row (`step_row`). What the numbers mean
is decided elsewhere (`detect`), by a callback the probe does not know.
"""

from __future__ import annotations

import functools
import math
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.hooks import RemovableHandle

from ..trace.columns import REAPPLIED, Trace
from . import inputs, loss_tap, reductions, step_row
from .carried import CarryCheck
from .layers import (
    acts_by_mode,
    bounds_of,
    first_tensor,
    is_nonnegative,
    iter_layers,
    own_named_params,
    own_params,
    role_of,
    tensors_in,
)
from .sampler import Sampler, is_reference_step
from .step_owner import StepOwner
from .weights import WeightProbe


class CostMeter(Protocol):
    """Where the probe records its own time, step by step (`live.selfcost.SelfCost`)."""

    def record(self, step: int, wall: float, own: float, hooks: float,
               sampled: float) -> None: ...

    def floor(self) -> float: ...


@dataclass
class StepRecord:
    """What a closed step hands on: its index and live references for capture.

    `refs` maps a layer index to the (input, output) of its last call in the step; they
    are valid only during the callback (the probe drops them right after).
    """

    step: int
    refs: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = field(default_factory=dict)
    batch: torch.Tensor | None = None
    params: list[tuple[str, nn.Parameter, int]] = field(default_factory=list)


_is_compiling = torch.compiler.is_compiling  # read on every layer call: one lookup saved
_transformed = torch._C._are_functorch_transforms_active
"""Inside `torch.func` transforms (`vmap`, `grad`, `jvp`: per-sample gradients, Jacobians)
the tensors a hook sees are wrapped: reading one on the host (`.item()`) or copying into
it raises, and the watch stopped at the first such call. Calls made there are left out
(`transformed_seen`), as compiled ones are."""
_grad_enabled = torch.is_grad_enabled
"""A model called with gradients off (`torch.no_grad()`, `torch.inference_mode()`) trains
nothing: an evaluation pass inside the training loop, a frozen teacher making targets.
The probe leaves such calls out; recorded, their batches and activations joined the next
training step's, and a validation set scaled unlike the training set read as a jump of
every layer at that step. What decides is the model's call, not the layer's: a frozen
backbone run under `no_grad` inside a forward that trains (or a checkpointed segment) is
recorded."""
_clock = time.perf_counter

_Hook = Callable[..., Any]


def _guarded(hook: _Hook) -> _Hook:
    """A hook that never breaks the training it watches: an error of the engine's own
    (a bug, a model it does not understand) goes to `Probe._fail`, which stops the watch
    and lets the training go on; hooks after that return at once. What the watch raises
    on purpose (`TrainingFailure`) goes through: the watch's `on_error` raises it again."""
    @functools.wraps(hook)
    def guarded(self: Probe, *args: Any) -> Any:
        if self.failed:
            return None
        try:
            return hook(self, *args)
        except Exception as exc:  # noqa: BLE001 - any error of ours: the training must go on
            self._fail(exc, hook.__name__.lstrip("_"))
            return None
    return guarded


@dataclass
class _Candidate:
    name: str
    module: nn.Module
    role: str
    bounds: tuple[float, float] | None
    nonneg: bool
    relu: bool  # exactly nn.ReLU: its max is the max of its input, floored at 0
    index: int = -1  # the trace's layer index, given at the first call (forward order)
    fewest: int = sys.maxsize  # the fewest elements a call output (`LayerInfo.outputs`)


class Probe:
    """Installs the hooks of one watch and turns each step into a trace row."""

    def __init__(self, trace: Trace, roots: list[tuple[str, nn.Module]] | None, *,
                 sample_every: int, hold_refs: bool, activations: bool = True,
                 overhead: float | None = None, hold_jump: float, cost: CostMeter,
                 on_step: Callable[[StepRecord], None],
                 on_error: Callable[[Exception, str], None]) -> None:
        """`hold_jump`: the abs-max move that makes a CPU activation worth holding
        for capture (the watch passes `Thresholds.wake_jump`, the wake test's factor).
        `cost`: where the probe records its own time, step by step. `on_error`: told of an
        error in a hook (the exception, the hook's name) before the probe stops; it may
        raise it again (see `_guarded`)."""
        self.trace = trace
        self.sampler = Sampler(sample_every, overhead)
        self.cost = cost
        # the engine's time since the last step boundary (seconds): the layer hooks'
        # per-step checks, the full statistics, everything else
        self._hook_s = self._rich_s = self._other_s = 0.0
        self._interval_start = _clock()
        self.activations = activations
        self._given = roots is not None
        self._hold = hold_refs
        self._hold_jump = hold_jump
        self._last_absmax: list[float] = []  # per layer, from the last step
        self._on_step = on_step
        self._on_error = on_error
        self.failed = False  # a hook failed: the probe records nothing more
        self._handles: list[RemovableHandle] = []
        self._unsubscribe: Callable[[], None] | None = None
        self._roots: set[int] = set()
        self._root_modules: list[nn.Module] = []
        # each root (its module, compiled or not) with its layers that act by mode
        self._modal: list[tuple[nn.Module, list[nn.Module]]] = []
        self._eval_layers = -1  # `_layers_in_eval` at the step's backwards; -1: none heard
        self._carry = CarryCheck()
        self._cand: dict[int, _Candidate] = {}
        self._index: dict[int, int] = {}
        self._owners: list[tuple[str, nn.Parameter, int]] = []  # (name, param, module id)
        self._params_cache: list[tuple[str, nn.Parameter, int]] = []
        self._weights = WeightProbe(self._owners, self._layer)
        self._steps = StepOwner(self._owners, self._index, trace, self._given)
        self._root_depth = 0
        self._eval_call = False  # the model's call in progress began with gradients off
        self.compiled_seen = False
        self.transformed_seen = False
        self.eval_seen = False  # a forward with gradients off was left out
        self.activations_seen = False  # a training forward's activation was recorded
        self.manual_steps = False
        self._closure_step = False  # the primary's step in progress was given a closure
        self.steps_seen = 0
        self._sc = reductions.Scalars()
        self._batch_rows = reductions.RichBatch()
        self._ramps = inputs.Ramps()  # the input fingerprint's weights
        self._called = 0  # layers numbered at the last step boundary
        self._masks: set[int] = set()  # layers whose -inf values are a mask (`step_row`)
        self._sampled = True
        self._batch: torch.Tensor | None = None
        # the last output reduced, its version then, its min and max: see `_known`
        self._last: tuple[weakref.ref[torch.Tensor] | None, int, Any, Any] = (
            None, -1, math.nan, math.nan)
        self._last_c: _Candidate | None = None  # the layer whose output `_last` is
        # with several models: their outputs of this step and the last, which are not data
        # where one feeds another (a GAN's generator its discriminator); held, so that
        # their memory is not a new batch's (see `_record_input`)
        self._root_outs: list[torch.Tensor] = []
        self._prev_outs: list[torch.Tensor] = []
        self._reset_step()
        self._last_fingerprint: step_row.Fingerprint | None = None
        for prefix, root in roots or []:
            self._add_root(root, prefix)

    # -- lifecycle ------------------------------------------------------------------
    def attach(self) -> None:
        """Install the hooks. A global forward hook would take every module call in the
        process off PyTorch's fast path, containers and other models included, so
        activations are heard through a hook on each layer; the only global module hook is
        the pre-hook that discovers models when none was given."""
        self._handles = [
            optim_module.register_optimizer_step_pre_hook(self._opt_pre),
            optim_module.register_optimizer_step_post_hook(self._opt_post),
        ]
        if not self._given:
            self._handles.append(nn_module.register_module_forward_pre_hook(self._pre))
        for root in self._root_modules:
            self._hook_root(root)
        self._hook_layers(list(self._cand.values()))
        self._unsubscribe = loss_tap.subscribe(self._on_backward)
        # the time outside the block (a re-entered watch) is no step of the loop
        self._interval_start = _clock()

    def _hook_layers(self, layers: list[_Candidate]) -> None:
        if self.activations:
            for c in layers:
                self._handles.append(
                    c.module.register_forward_hook(functools.partial(self._post, c)))

    def _hook_root(self, root: nn.Module) -> None:
        """Per-root hooks (they see keyword arguments, global hooks do not): the input
        batch is the first tensor of a top-level call of a root. They run outside any
        compiled graph (`model.compile()` compiles the call, hooks included): dynamo
        breaks the graph before the forward and calls them as they are."""
        pre = torch._dynamo.disable(self._root_pre, recursive=True)
        post = torch._dynamo.disable(self._root_post, recursive=True)
        self._handles.append(root.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(root.register_forward_hook(post, always_call=True))

    def detach(self) -> None:
        """Remove every hook; safe to call twice."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._refs.clear()
        self._weights.release()
        self._root_depth = 0
        self._eval_call = False
        self._root_outs, self._prev_outs = [], []
        self._batch_rows.release()
        self._ramps.release()

    def _fail(self, exc: Exception, where: str) -> None:
        """A hook raised: the watch is told (and may raise it again); otherwise the probe
        stops recording. Its hooks stay installed until the block ends, each returning at
        once: removing one while PyTorch iterates over them (the optimizer's step hooks)
        would itself break the step."""
        self._on_error(exc, where)
        self.failed = True
        self._refs.clear()
        self._weights.release()
        self._root_outs, self._prev_outs = [], []
        self._batch_rows.release()
        self._ramps.release()

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    # -- roots and layers -----------------------------------------------------------
    def _add_root(self, root: nn.Module, prefix: str) -> list[_Candidate]:
        """Register root's layers and parameters; the layers that are new."""
        self._roots.add(id(root))
        self._root_modules.append(root)
        root = _unwrapped(root)
        self._modal.append((root, [m for m in root.modules() if acts_by_mode(m)]))
        seen = {id(p) for _, p, _ in self._owners}
        new = []
        for name, m in iter_layers(root, prefix):
            if id(m) in self._cand:
                continue
            c = self._cand[id(m)] = _Candidate(name, m, role_of(m), bounds_of(m),
                                               is_nonnegative(m), type(m) is nn.ReLU)
            new.append(c)
            for pname, p in own_named_params(m):
                if id(p) not in seen:
                    seen.add(id(p))
                    self._owners.append((f"{name}.{pname}", p, id(m)))
        return new

    def _layer(self, mid: int) -> int:
        idx = self._index.get(mid)
        if idx is None:
            c = self._cand[mid]
            own = own_params(c.module)
            idx = c.index = self.trace.add_layer(
                c.name, type(c.module).__name__, c.role, bool(own),
                primary_lr=mid not in self._steps.other_lr, params=sum(p.numel() for p in own))
            self._index[mid] = idx
        return idx

    # -- hooks ----------------------------------------------------------------------
    @_guarded
    def _pre(self, module: nn.Module, args: tuple) -> None:
        if _is_compiling():
            self.compiled_seen = True
            return
        if _transformed():
            self.transformed_seen = True
            return
        mid = id(module)
        if not _grad_enabled():  # a model seen only in evaluation is not discovered
            self.eval_seen = True
        elif mid not in self._roots and not self._given and self._root_depth == 0 \
                and mid not in self._cand and next(module.parameters(), None) is not None:
            n = len(self._root_modules)
            new = self._add_root(module, "" if n == 0 else f"{type(module).__name__}{n}.")
            self._hook_root(module)  # from the next call on; this one is recorded here
            self._hook_layers(new)  # the layers' hooks hear this call already
            self._root_pre(module, args, {})
        if mid in self._cand and mid not in self._index:
            self._layer(mid)

    @_guarded
    def _root_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self._root_depth == 0:
            transformed = _transformed()
            self._eval_call = transformed or not _grad_enabled()
            if transformed:  # (`_transformed`)
                self.transformed_seen = True
            elif self._eval_call:
                self.eval_seen = True
            else:
                t0 = _clock()
                self._record_input(args, kwargs)
                self._other_s += _clock() - t0
        self._root_depth += 1

    @_guarded
    def _root_post(self, module: nn.Module, args: tuple, output: object) -> None:
        self._root_depth = max(0, self._root_depth - 1)
        if self._root_depth == 0:
            if not self._eval_call:
                self._model_output(output)
                out = first_tensor(output, floating=False) if len(self._root_modules) > 1 \
                    else None
                if out is not None and _storage_at(out):
                    self._root_outs.append(out.detach())
            self._eval_call = False

    @_guarded
    def _post(self, c: _Candidate, module: nn.Module, args: tuple, output: object) -> None:
        """A layer's forward hook: the cheap path (min and max: read at once on the host,
        kept on the device until the step closes elsewhere), and the rich statistics on
        sampled steps. It runs on every layer call, so it is kept to a few attribute
        reads around one reduction (none for a ReLU fed by the layer just reduced, nor
        for a layer returning the very output just reduced: a model with parameters of
        its own returning its last layer's output, an identity)."""
        if _is_compiling():
            self.compiled_seen = True
            return
        if _transformed():
            self.transformed_seen = True
            return
        if self._eval_call or (not self._root_depth and not _grad_enabled()):
            self.eval_seen = True  # an evaluation (see `_grad_enabled`)
            if c.index < 0:  # its place in forward order all the same (checkpointing a
                self._layer(id(module))  # whole model runs its first call without them)
            return
        y = output if type(output) is torch.Tensor else first_tensor(output)
        if y is None or not y.is_floating_point():
            return
        t_in = _clock()
        if y.layout != torch.strided:  # sparse: its stored values (see `reductions.stored_values`)
            y = reductions.stored_values(y.detach())
        numel = y.numel()
        if numel == 0:
            return  # its check's time, a few attribute reads, is not counted
        idx = c.index if c.index >= 0 else self._layer(id(module))
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
            else:
                self._rich.append((idx, numel, *reductions.rich_activation(
                    y, c.role, c.bounds, self._sc, finite=finite, nonneg=c.nonneg)))
            spent = _clock() - t0
            self._rich_s += spent
            t_in += spent  # the per-step checks' time goes on without it
        if self._hold and (self._hold_all or not host or self._unusual(idx, mn, mx)):
            self._refs[idx] = (x, y)  # the capture store detaches them
        self._hook_s += _clock() - t_in

    def _model_output(self, output: object) -> None:
        """A bounded activation whose output is the model's (a classifier's final
        sigmoid) is not judged for saturation: a confident model's output is at its bounds
        by design. It was a warning on healthy binary classifiers. Its role becomes
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
                               last.storage_offset() and _storage_at(out) == _storage_at(last) != 0):
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
        memory every step: large activations cost a conv net 5-10% of its step time that
        way (fresh pages), and small ones, held freely until session 13, cost the
        100-layer MLP 4% (`benchmarks/compare.py`: 200 blocks of 64 KB a step, released
        cold at the close)."""
        if mn == -math.inf and idx in self._masks:
            mn = mx  # its mask (`step_row.masking`)
        now = max(abs(mn), abs(mx))  # a NaN is in both
        before = self._last_absmax[idx] if idx < len(self._last_absmax) else math.nan
        if now == before:
            return False
        return not (math.isfinite(now) and before > 0
                    and before / self._hold_jump < now < before * self._hold_jump)

    def _record_input(self, args: tuple, kwargs: dict) -> None:
        found = first_tensor(args, floating=False)
        if found is None:
            found = first_tensor(kwargs, floating=False)
        if found is None or found.numel() == 0 or found.is_complex():
            return
        self._steps.last_input = weakref.ref(found)
        if len(self._root_modules) > 1:  # is it another watched model's output?
            if found.requires_grad:  # computed from one (WGAN-GP's interpolates), or made
                return  # to take gradients: with several models, not the data
            at = _storage_at(found)
            if at and any(_storage_at(o) == at for o in (*self._root_outs, *self._prev_outs)):
                return  # another watched model's output, or a view of it: not data
        batch = found.detach()
        summary = inputs.input_batch(batch, self._sampled, self._sc, self._ramps)
        self._inputs.append((summary, batch.numel()))
        if self._hold:
            self._batch = batch

    @_guarded
    def _on_backward(self, root: torch.Tensor) -> None:
        t0 = _clock()
        self._losses.append(self._sc.add(root.detach()))
        self._carry.at_backward(self._sc)
        self._eval_layers = max(self._eval_layers, self._layers_in_eval())
        self._other_s += _clock() - t0

    def _layers_in_eval(self) -> int:
        """Layers that act by mode (`acts_by_mode`: dropout, BatchNorm) found in eval mode
        as a backward starts, in the watched models that have weights to train and are in
        eval mode themselves: a model left in `model.eval()` after an evaluation trains
        without dropout, and its BatchNorm normalises with running statistics it no longer
        updates. Not counted: a layer put in eval mode on purpose inside a model in
        training mode (BatchNorm frozen while fine-tuning), a frozen model kept in eval
        mode (a teacher, a perceptual loss network). One attribute read per model when
        all is well."""
        n = 0
        for root, modal in self._modal:
            if modal and not root.training and any(p.requires_grad for p in root.parameters()):
                n += sum(not m.training for m in modal)
        return n

    @_guarded
    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        primary = self._steps.before_step(opt)
        if primary is None:  # no optimizer trains the watched weights yet, nor does this one
            return
        if primary is opt:
            self.steps_seen += 1
            self._before_update()
            # a closure runs the step's forward and backward inside the step: it closes
            # after it (`_opt_post`); `args` starts with the optimizer itself
            self._closure_step = callable(kwargs.get("closure", args[1] if len(args) > 1
                                                     else None))
            if not self._closure_step:
                self._close(opt)
        elif self._weights.measuring and self._steps.trains_watched(opt):
            # another optimizer of the step (a GAN's generator): its update is measured
            # on the step the primary's was, and adds to it
            self._weights.keep_before()

    @_guarded
    def _opt_post(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        primary = self._steps.primary
        if primary is opt:
            if self._closure_step:
                self._closure_step = False
                self._close(opt)
            self._after_update(primary=True)
        elif primary is not None and self._steps.trains_watched(opt):
            self._after_update(primary=False)  # the weights are read after every update

    # -- user-facing step API ---------------------------------------------------------
    @_guarded
    def manual_step(self) -> None:
        """Close a step by hand (loops without an optimizer)."""
        self.manual_steps = True
        self._close(None)
        self._after_update()

    def log_loss(self, value: float | torch.Tensor) -> None:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(f"log_loss takes a scalar; got a tensor of shape "
                                 f"{tuple(value.shape)}. Reduce it first, e.g. loss.mean().")
            self._logged.append(self._sc.add(value.detach().reshape(())))
        else:
            self._logged_host.append(float(value))

    @property
    def has_pending(self) -> bool:
        """Something was recorded since the last step boundary."""
        return bool(self._c_idx or self._losses or self._inputs or self._logged
                    or self._logged_host)

    # -- the step boundary -------------------------------------------------------------
    def _reset_step(self) -> None:
        self._c_idx: list[int] = []
        self._c_mn: list[float] = []  # NaN where the value is on a device (below)
        self._c_mx: list[float] = []
        self._c_dev: list[int] = []  # positions in the lists above of device values
        self._d_mn: list[torch.Tensor] = []
        self._d_mx: list[torch.Tensor] = []
        self._last = (None, -1, math.nan, math.nan)
        self._last_c = None
        self._rich: list[tuple[int, ...]] = []  # layer, numel, rich_activation's positions
        self._rich_rows: list[tuple[int, int, tuple[Any, ...], int]] = []  # idx, numel, group, row
        self._batch_rows.clear()
        self._inputs: list[tuple[dict[str, int], int]] = []
        self._losses: list[int] = []
        self._carry.new_step()
        self._logged: list[int] = []
        self._logged_host: list[float] = []
        self._eval_layers = -1
        self._refs: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        self._batch = None
        self._prev_outs, self._root_outs = self._root_outs, []
        self._hold_all = self._sampled or is_reference_step(self.trace.n_steps)

    def _params(self) -> list[tuple[str, nn.Parameter, int]]:
        """(name, parameter, layer index) of every watched parameter; rebuilt only when
        a model is discovered."""
        if len(self._params_cache) != len(self._owners):
            self._params_cache = [(name, p, self._layer(mid)) for name, p, mid in self._owners]
        return self._params_cache

    def _close(self, opt: torch.optim.Optimizer | None) -> None:
        """The step boundary: the step's numbers, queued on the device, go to the host in
        one transfer and become one trace row (`step_row`), with the last update's
        weights (`WeightProbe`) and whether the gradients were zeroed (`CarryCheck`);
        then `on_step` (detection, capture) and the next step's sampling decision."""
        t_enter = _clock()
        sc = self._sc
        params = self._params()
        with_grad = [(g, idx) for _, p, idx in params if (g := p.grad) is not None]
        g_pos = reductions.grouped_norms([g for g, _ in with_grad], sc)
        missing = self._missing(opt, bool(with_grad), params)
        p_mn, p_mx = sc.extend(self._d_mn), sc.extend(self._d_mx)
        if self._rich_rows:
            self._reduce_rows()
        lr_host, lr_pos = math.nan, -1
        if opt is not None and opt.param_groups:
            lr = opt.param_groups[0].get("lr", math.nan)
            if isinstance(lr, torch.Tensor):
                lr_pos = sc.add(lr.detach())
            else:
                lr_host = float(lr)
        t_x = _clock()
        v = sc.to_host()  # the step's one device-to-host transfer
        if sc.from_device:  # it waited for the device work queued before it, mostly the
            self._other_s -= _clock() - t_x  # training's: not the engine's time (`selfcost`)

        step = self.trace.n_steps
        n = self.trace.n_layers
        row: dict[str, np.ndarray] = {}
        mins, maxs = self._c_mn, self._c_mx  # reset with the step: filled in place
        if self._c_dev:
            k = len(self._c_dev)
            for j, lo, hi in zip(self._c_dev, v[p_mn:p_mn + k], v[p_mx:p_mx + k]):
                mins[j], maxs[j] = lo, hi
        if n > self._called:  # layers first called in this step: a mask of -inf by design?
            self._masks |= step_row.masking(self._c_idx, mins, maxs, self._called)
            self._called = n
        row["act_absmax"] = step_row.absmax(self._c_idx, mins, maxs, n, self._masks)
        self.activations_seen = self.activations_seen or bool(self._c_idx)
        self._last_absmax = row["act_absmax"].tolist()
        if self._rich:
            row.update(step_row.rich_columns(self._rich, v, n))
        # the last update's weight norms (`WeightProbe`) go into the last row, in one
        # pass with this step's gradient norms
        norms = step_row.layer_norms(v, [(g_pos, [i for _, i in with_grad])]
                                     + (self._weights.parts() if step > 0 else []), n)
        row["grad_norm"] = norms[0]
        self._weights.record(self.trace, step - 1, norms[1:], v)

        carried = self._carry.judge(self._carry.witness(opt, params), v, len(self._losses))
        if opt is None and carried == REAPPLIED:  # `run.step()` with no backward: logging
            carried = math.nan
        scalars = {"lr": v[lr_pos] if lr_pos >= 0 else lr_host,
                   "loss": step_row.loss(v, self._losses, self._logged, self._logged_host),
                   "sampled": float(self._sampled),
                   "eval_layers": self._eval_layers if self._eval_layers >= 0 else math.nan,
                   "grad_carried": carried, "grads_missing": missing}
        if self._steps.input_trained:  # (`StepOwner.input_trained`)
            self._inputs.clear()
        inputs, self._last_fingerprint = step_row.input_scalars(self._inputs, v,
                                                                 self._last_fingerprint)
        scalars.update(inputs)
        self.trace.append(row, scalars)

        record = StepRecord(step, self._refs, self._batch, params)
        self._sampled = self._next_sampled(step, t_enter)
        refs = self._refs
        self._reset_step()
        try:
            self._on_step(record)
        finally:
            refs.clear()
            self._end_interval(step, t_enter)

    def _missing(self, opt: torch.optim.Optimizer | None, any_grad: bool,
                 params: list[tuple[str, nn.Parameter, int]]) -> float:
        """1.0 where a backward ran in the step but, at the optimizer's step, no watched
        weight held a gradient although some are trainable: the gradients were cleared
        between the backward and the step (`zero_grad()` after `backward()`), or the loss
        does not depend on the model (its output detached). Nothing trains, and nothing
        else says so. 0.0 where some weight had one, NaN where it cannot be told (no
        backward heard; a step closed by hand, whose loop may clear them on purpose)."""
        if opt is None or not self._losses:
            return math.nan
        if any_grad:
            return 0.0
        return 1.0 if any(p.requires_grad for _, p, _ in params) else math.nan

    def _next_sampled(self, step: int, t_enter: float) -> bool:
        """Whether the next step gets the full statistics (`Sampler`), told what this
        step's cost so far."""
        spent, floor = self._rich_s, 0.0
        if spent > 0 and self.sampler.overhead:
            floor = self.cost.floor()
        now = _clock()
        plain = now - self._interval_start - self._own(t_enter, now)
        return self.sampler.next(step, self._sampled, spent, plain, floor)

    def _own(self, t_enter: float, now: float) -> float:
        """The engine's time in this step so far: its hooks', and the step boundary's
        since `t_enter`."""
        return self._hook_s + self._rich_s + self._other_s + (now - t_enter)

    def _end_interval(self, step: int, t_enter: float) -> None:
        """The step boundary's end: the step's time and the engine's part of it go to
        `cost`, and the next step starts."""
        now = _clock()
        self.cost.record(step, now - self._interval_start, self._own(t_enter, now),
                         self._hook_s, self._rich_s)
        self._interval_start = now
        self._hook_s = self._rich_s = self._other_s = 0.0

    def _reduce_rows(self) -> None:
        """The batched rows' statistics, as `_rich` entries (see `reductions.RichBatch`)."""
        t0 = _clock()
        first = self._batch_rows.reduce(self._sc)
        for idx, numel, key, r in self._rich_rows:
            *pos, units, counted = first[key]
            self._rich.append((idx, numel, *(p + r if p >= 0 else -1 for p in pos),
                               units, counted))
        self._rich_s += _clock() - t0

    def _before_update(self) -> None:
        """Before the update of a sampled step: the weight probe's copy that the update
        is measured against (`_after_update`)."""
        if self._sampled:
            self._weights.keep_before()

    def _after_update(self, primary: bool = True) -> None:
        """After an optimizer's update: the weight probe (`WeightProbe.after_update`),
        sent with the next step's transfer."""
        t0 = _clock()
        self._weights.after_update(self._sc, primary)
        self._other_s += _clock() - t0

    def flush(self) -> None:
        """At exit: move the last update's weight norms into the last row."""
        if self._weights.flush(self.trace, self._sc):
            self._reset_step()

    def close_partial(self) -> tuple[str, str]:
        """At exit of a loop that never stepped: what was recorded becomes one step.
        Returns (what it means, in a clause for the story's headline; why, for the run's
        notes): no optimizer at all, or one that trains none of the watched parameters
        (`StepOwner.foreign_steps`)."""
        foreign = self._steps.foreign_steps
        if foreign:
            what = ("the model did not train: the optimizer that stepped trains none of its "
                    "parameters")
            why = (f"an optimizer stepped {foreign} time"
                   f"{'s' * (foreign != 1)}, but none of the parameters it trains "
                   f"are the watched model's: the model never changed, and the whole block "
                   f"was recorded as one step. The optimizer was made for another model, "
                   f"most likely an earlier copy of this one (the cell that makes the model "
                   f"was run again after the one that makes the optimizer). Make the "
                   f"optimizer again from this model, e.g. "
                   f"torch.optim.AdamW(model.parameters()).")
        else:
            what = "no optimizer step was seen, so the block was not judged step by step"
            why = ("no optimizer step was seen, so the whole block was recorded as one step. "
                   "Call run.step() once per training step in loops without an optimizer.")
        self._close(None)
        return what, why


_WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


def _unwrapped(root: nn.Module) -> nn.Module:
    """The model inside the wrappers that add nothing to a layer's health: torch.compile's
    OptimizedModule (`_orig_mod`), DistributedDataParallel and DataParallel (`module`), in
    any nesting. Its layers are named as the user's model names them ("encoder.0", not
    "module._orig_mod.encoder.0"); the hooks on the root stay on the wrapper, which is
    what the loop calls."""
    while True:
        inner = root.module if isinstance(root, _WRAPPERS) else getattr(root, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return root
        root = inner


def _storage_at(t: torch.Tensor) -> int:
    """The address of `t`'s memory, shared by its views and detached copies; 0 where it
    has none to compare (sparse and jagged layouts, tensor subclasses without one)."""
    if t.layout != torch.strided:
        return 0
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage of its own: nothing to match
        return 0
