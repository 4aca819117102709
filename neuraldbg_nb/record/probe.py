"""The hooks of one watch: installed and removed together, each handing its call to the part
of `record` that records it.

The parts only record: the forward hooks summarise each layer's output on the device
(`forward`), the models' calls give the input batch (`inputs`), the loss tap hears the
tensor that `backward()` is called on (`backward`), and the optimizers' step hooks end the
steps and read the weights around each update (`optimizer`). At the step boundary the
step's numbers go to the host in one transfer and become one trace row (`boundary`). What
the numbers mean is decided elsewhere (`detect`), by a callback the probe does not know.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module
from torch.utils.hooks import RemovableHandle

from ..trace.columns import Trace
from . import compile_warning, loss_tap, pickling, reductions
from .backward import Backwards
from .boundary import Boundary, StepRecord
from .compiled_call import CallWrapped, compiled_in_place
from .discovery import Candidate, Models, unwrapped
from .forward import Forward
from .guard import guarded
from .inputs import Inputs
from .layer_hooks import LayerHooks
from .optimizer import Optimizers, with_closure
from .replay import Replay
from .sampler import Sampler
from .step_owner import StepOwner
from .timing import CostMeter, StepTimer, clock
from .weights import WeightProbe

__all__ = ["CostMeter", "Probe", "StepRecord"]


class Probe:
    """Installs the hooks of one watch and hands each call to the part that records it."""

    def __init__(self, trace: Trace, roots: list[tuple[str, nn.Module]] | None, *,
                 sample_every: int, hold_refs: bool, activations: bool = True,
                 overhead: float | None = None, hold_jump: float, cost: CostMeter,
                 layer_hooks: str = "every",
                 on_step: Callable[[StepRecord], None],
                 on_error: Callable[[Exception, str], None]) -> None:
        """`roots`: the models to watch, with the prefix of their layers' names (None:
        found as they run). `hold_refs`: hold tensors for capture. `hold_jump`: the
        abs-max move that makes a CPU activation worth holding for capture (the watch
        passes `Thresholds.wake_jump`, the wake test's factor). `cost`: where the probe
        records its own time, step by step. `on_step`: told of each closed step.
        `on_error`: told of an error in a hook (the exception, the hook's name) before
        the probe stops; it may raise it again (see `guard.guarded`). `layer_hooks`:
        "every" hooks every layer call of every step; "sampled" hooks the layers only for
        the forwards of sampled and reference steps (and of a step `trace.HOOK_GAP` after
        the last hooked one, where those are further apart), and replays the forward of a step whose cheap signals went wrong (`replay`)
        with them on."""
        if layer_hooks not in ("every", "sampled"):
            raise ValueError(f"layer_hooks must be 'every' or 'sampled', got {layer_hooks!r}")
        self.trace = trace
        self.activations = activations
        self._on_error = on_error
        self.failed = False
        """A hook failed: the probe records nothing more."""
        self._handles: list[RemovableHandle] = []
        self._discovery: RemovableHandle | None = None  # the global pre-hook, while in
        # optimizer -> ((its parameters, the watched ones), whether it trains others)
        self._known_opts: weakref.WeakKeyDictionary[
            torch.optim.Optimizer, tuple[tuple[int, int], bool]] = weakref.WeakKeyDictionary()
        self._armed = False
        self._sampled_hooks = layer_hooks == "sampled" and activations
        self._own: set[int] = set()  # the ids of this probe's hooks on modules
        self._compiled: set[int] = set()  # ids of the modules of roots compiled in place
        self._replay = Replay(self._own, self._layer_name) if self._sampled_hooks else None
        self._quiet: Any = None  # the compile-warning filter while the global hook is in
        self._unsubscribe: Callable[[], None] | None = None
        sc = reductions.Scalars()
        self._models = models = Models(trace, given=roots is not None)
        self._forward = Forward(models, sc, hold=hold_refs, hold_jump=hold_jump,
                                found=self._found, fail=self._fail)
        self._inputs = Inputs(models, sc, hold_refs)
        self._layer_hooks = LayerHooks(self._forward.post, self._owned, self._unhook)
        self._backwards = Backwards(models, sc)
        self._timer = StepTimer(cost, Sampler(sample_every, overhead), self._forward)
        self._weights = WeightProbe(models.owners, models.layer)
        self._steps = StepOwner(models, self._rescan)
        self._boundary = Boundary(trace, models, self._forward, self._inputs,
                                  self._backwards, self._weights, self._steps, sc,
                                  self._timer, on_step, replay=self._replay,
                                  set_hooks=self._set_hooks if self._sampled_hooks else None,
                                  hook_layers=self._hook_layers,
                                  hook_parts=self._hook_parts if self._sampled_hooks else None)
        self._parts: set[int] = set()  # ids of the parts hooked by `_hook_parts`
        self._optimizers = Optimizers(self._steps, self._weights, self._boundary,
                                      self._inputs, self._timer, sc)
        for prefix, root in roots or []:
            models.add_root(root, prefix)

    # -- lifecycle ------------------------------------------------------------------
    def attach(self) -> None:
        """Install the hooks. A global forward hook would take every module call in the
        process off PyTorch's fast path, containers and other models included, so
        activations are heard through a hook on each layer; the only global module hook is
        the pre-hook that finds models when none was given."""
        self._handles = [
            optim_module.register_optimizer_step_pre_hook(self._opt_pre),
            optim_module.register_optimizer_step_post_hook(self._opt_post),
        ]  # global registries: nothing of a model's state holds them
        if not self._models.given:
            self._discover(True)
        for root in self._models.root_modules:
            self._hook_root(root)
        self._armed = True
        self._hook_layers(list(self._models.candidates.values()))
        self._unsubscribe = loss_tap.subscribe(self._on_backward)
        self._timer.start()

    def _hook_layers(self, layers: list[Candidate]) -> None:
        if self.activations and self._armed:
            compiled = self._compiled
            self._layer_hooks.on([c for c in layers if id(c.module) not in compiled]
                                 if compiled else layers)

    def _layer_name(self, module: nn.Module) -> str | None:
        """`module`'s name as a layer of the watched models (None: it is no layer)."""
        c = self._models.candidates.get(id(module))
        return c.name if c is not None else None

    def _rescan(self) -> None:
        """The models walked for layers the loop put in since (`Models.rescan`), the new
        ones hooked."""
        new = self._models.rescan()
        if new:
            self._hook_layers(new)

    def _set_hooks(self, on: bool) -> None:
        """The layer hooks on for the next forward, or off (`layer_hooks="sampled"`: at
        each step boundary, for the step that follows; around a replay)."""
        if on and not self._armed:
            self._armed = True
            layers = list(self._models.candidates.values())
            self._layer_hooks.whole(layers)
            self._hook_layers(layers)
        elif not on and self._armed:
            self._armed = False
            self._layer_hooks.off()

    def _owned(self, handle: RemovableHandle) -> RemovableHandle:
        """A hook of this probe on a module: told apart from the model's own (`replay`),
        and left out of pickles and copies (`pickling.own`)."""
        self._own.add(handle.id)
        return pickling.own(handle)

    def _unhook(self, handles: list[RemovableHandle]) -> None:
        for h in handles:
            h.remove()
            pickling.release(h)
            self._own.discard(h.id)

    def _discover(self, on: bool) -> None:
        """The global pre-hook that finds models (no model given) in, or out. It puts
        every module call of the process on PyTorch's slow path, so it is out from the
        first step boundary on, and back for the next forward where an optimizer steps
        weights of no model found (`_opt_pre`)."""
        if on and self._discovery is None:
            self._discovery = nn_module.register_module_forward_pre_hook(self._forward.pre)
            if self._quiet is None:
                self._quiet = compile_warning.quiet()
        elif not on and self._discovery is not None:
            self._discovery.remove()
            self._discovery = None
            if self._quiet is not None:
                compile_warning.restore(self._quiet)
                self._quiet = None

    def _unknown_weights(self, opt: torch.optim.Optimizer) -> bool:
        """Does `opt` train weights of no model found? Looked at again only when its
        parameter groups or the watched weights change."""
        params = self._models.params()
        key = (sum(len(g["params"]) for g in opt.param_groups), self._models.version)
        seen = self._known_opts.get(opt)
        if seen is not None and seen[0] == key:
            return seen[1]
        known = {id(p) for _, p, _ in params}
        unknown = not all(id(p) in known for g in opt.param_groups for p in g["params"])
        self._known_opts[opt] = (key, unknown)
        return unknown

    def _hook_root(self, root: nn.Module) -> None:
        """Per-root hooks (they see keyword arguments, global hooks do not): the input
        batch is the first tensor of a top-level call of a root. A root compiled in
        place (`compiled_call`) gets no layer hooks: its graphs never run them, and
        putting them on and off between steps would make it compile other graphs, whose
        results may differ in the last bit."""
        if compiled_in_place(root):
            self._compiled.update(id(m) for m in root.modules())
            self._forward.compiled_seen = True
        self._hook_calls(root, self._root_pre, self._root_post)

    def _hook_calls(self, module: nn.Module, pre: Callable[..., None],
                    post: Callable[..., None]) -> None:
        """`pre` and `post` on each call of `module` (with its keyword arguments; `post`
        also where the forward raised). They run outside any compiled graph: around the
        compiled call of a module compiled in place (`compiled_call`), whose graphs a
        hook of its own would change; elsewhere dynamo breaks the graph of an enclosing
        compiled call before them and calls them as they are."""
        if compiled_in_place(module):
            self._handles.append(self._owned(CallWrapped(module, pre, post)))
            return
        pre = torch._dynamo.disable(pre, recursive=True)
        post = torch._dynamo.disable(post, recursive=True)
        self._handles.append(self._owned(module.register_forward_pre_hook(pre, with_kwargs=True)))
        self._handles.append(self._owned(module.register_forward_hook(post, always_call=True)))

    def _hook_parts(self) -> None:
        """The loop trains a model through its parts, not the model (`Forward.outside`:
        `model.encoder(x)`, a Lightning `training_step` that calls `self.net(x)`): each
        part a root holds at its top level that holds such a layer gets hooks that make
        its calls the step's calls, remembered for a replay (`Replay.record`). Not its
        input: the input batch is what the loop gives the model (or `run.log_input`),
        not what one part gives another."""
        outside = self._forward.outside
        if not outside:
            return
        for root in self._models.root_modules:
            for part in unwrapped(root).children():
                if id(part) not in self._parts and any(
                        id(m) in outside for m in part.modules()):
                    self._parts.add(id(part))
                    self._hook_calls(part, self._part_pre, self._part_post)
        outside.clear()

    @guarded
    def _part_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        replay = self._replay
        if replay is None or replay.active:
            return
        if self._forward.enter_call():
            t0 = clock()
            replay.record(module, args, kwargs)
            self._timer.other_s += clock() - t0

    @guarded
    def _part_post(self, module: nn.Module, args: tuple, output: object) -> None:
        if self._replay is not None and self._replay.active:
            return
        if self._forward.leave_call(output, whole=False):
            t0 = clock()
            self._replay_output(output)
            self._timer.other_s += clock() - t0

    def _replay_output(self, output: object) -> None:
        """A training call's output, for a replay of its step to compare with
        (`Replay.output`: at steps not hooked, the only ones replayed), and the nodes of
        its tensors, for a reach test to tell which the loss used (`Replay.returned`)."""
        replay = self._replay
        if replay is not None:
            replay.returned(output)
            if not self._boundary.hooked:
                replay.output(output)

    def _found(self, module: nn.Module, args: tuple) -> None:
        """A model first called (no model given): its hooks hear its calls from the next
        one on, its layers' from this one; this call's input is recorded here."""
        new = self._models.discover(module)
        self._hook_root(module)
        self._hook_layers(new)
        self._root_pre(module, args, {})

    def detach(self) -> None:
        """Remove every hook; safe to call twice."""
        self._unhook(self._handles)
        self._layer_hooks.remove()
        self._handles = []
        self._armed = False
        self._discover(False)
        if self._quiet is not None:
            compile_warning.restore(self._quiet)
            self._quiet = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._forward.end_calls()
        self._release()

    def _fail(self, exc: Exception, where: str) -> None:
        """A hook raised: the watch is told (and may raise it again); otherwise the probe
        stops recording. Its hooks stay installed until the block ends, each returning at
        once: removing one while PyTorch iterates over them (the optimizer's step hooks)
        would itself break the step."""
        self._on_error(exc, where)
        self.failed = self._forward.failed = True
        self._release()

    def _release(self) -> None:
        """Drop every tensor the parts hold (the block ends, or the probe failed)."""
        self._forward.release()
        if self._replay is not None:
            self._replay.release()
        self._weights.release()
        self._inputs.release()

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    @property
    def replays(self) -> int:
        """Forwards replayed at anomalous steps."""
        return self._replay.replays if self._replay is not None else 0

    @property
    def replay_refused(self) -> str | None:
        """Why a step's forward could not be replayed, the first time it could not."""
        return self._replay.refused if self._replay is not None else None

    # -- hooks ------------------------------------------------------------------------
    @guarded
    def _root_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        replay = self._replay
        if replay is not None and replay.active:
            return  # the replay's call: its input is the step's, already recorded
        if self._forward.enter_call():
            t0 = clock()
            if replay is not None:
                replay.record(module, args, kwargs)
            self._inputs.record(args, kwargs)
            self._timer.other_s += clock() - t0

    @guarded
    def _root_post(self, module: nn.Module, args: tuple, output: object) -> None:
        if self._replay is not None and self._replay.active:
            return
        if self._forward.leave_call(output):
            t0 = clock()
            self._inputs.model_output(output)
            self._replay_output(output)
            self._timer.other_s += clock() - t0

    @guarded
    def _on_backward(self, root: torch.Tensor) -> None:
        t0 = clock()
        self._backwards.heard(root)
        self._timer.other_s += clock() - t0

    @guarded
    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict
                 ) -> tuple[tuple, dict] | None:
        wrap = self._optimizers.pre(opt, args, kwargs)
        if not self._models.given:  # models are known after the first step's forward
            self._discover(self._unknown_weights(opt))
        if wrap:  # the step closes when its closure returns (`Optimizers.closure_ran`)
            return with_closure(args, kwargs, lambda: self._closure_ran(opt))
        return None

    @guarded
    def _closure_ran(self, opt: torch.optim.Optimizer) -> None:
        self._optimizers.closure_ran(opt)

    @guarded
    def _opt_post(self, opt: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self._optimizers.post(opt, args, kwargs)
        if self._replay is not None:  # the calls so far ran on weights an update changed
            self._replay.new_step()  # (a GAN's other optimizer): they are not replayed

    # -- the run's step API (`report.run.Recorder`) -----------------------------------
    @guarded
    def manual_step(self) -> None:
        """Close a step by hand (loops without an optimizer)."""
        self._optimizers.manual_step()

    def log_loss(self, value: float | torch.Tensor) -> None:
        """The step's loss, where it is not the tensor `backward()` is called on."""
        self._backwards.log_loss(value)

    def sum_losses(self) -> None:
        """The loop scales each backward's loss for gradient accumulation: a step's loss
        is the sum of its backwards' (`step_row.loss`)."""
        self._backwards.accumulated = True

    @guarded
    def log_input(self, batch: object) -> None:
        """The step's input batch, where the watched model is not called with it (a
        framework's training step calls its submodules); the model's own calls in this
        step then record no other batch."""
        t0 = clock()
        self._inputs.record((batch,), {}, given=True)
        self._timer.other_s += clock() - t0

    # -- what the watch reads at the end of a block -------------------------------------
    @property
    def has_pending(self) -> bool:
        """Something was recorded since the last step boundary."""
        return self._boundary.pending

    @property
    def steps_seen(self) -> int:
        """Steps of the primary optimizer."""
        return self._optimizers.steps_seen

    @property
    def manual_steps(self) -> bool:
        """A step was closed by hand (`run.step()`)."""
        return self._optimizers.manual_steps

    @property
    def foreign_steps(self) -> int:
        """Steps of optimizers that train none of the watched weights, while none that
        does had stepped (`StepOwner.foreign_steps`)."""
        return self._steps.foreign_steps

    @property
    def compiled_seen(self) -> bool:
        """A call under torch.compile was left out (hooks do not run in compiled graphs)."""
        return self._forward.compiled_seen

    @property
    def transformed_seen(self) -> bool:
        """A call inside torch.func transforms was left out."""
        return self._forward.transformed_seen

    @property
    def zeroed_before_step(self) -> bool:
        """A step closed by hand (`run.step()`) found every gradient zeroed in place: the
        loop zeroes them before it closes the step, and they were not measured."""
        return self._boundary.zeroed_before_step

    @property
    def eval_seen(self) -> bool:
        """A forward with gradients off was left out."""
        return self._forward.eval_seen

    @property
    def activations_seen(self) -> bool:
        """A training forward's activation was recorded."""
        return self._forward.activations_seen

    def flush(self) -> None:
        """At exit: move the last update's weight norms into the last row."""
        self._boundary.flush()

    def close_trailing(self) -> None:
        """At exit: backwards heard after the last step boundary (iterations whose
        optimizer step a GradScaler skipped, a loop that stopped between its backward and
        its step) become one last step, so that they are judged. A failure here stops the
        probe (`_fail`), never the user's own exit or exception."""
        if self.failed or not self._backwards.any_heard or self._optimizers.others_stepped \
                or not (self.steps_seen or self.manual_steps):
            return
        try:
            self._boundary.close(None)
        except Exception as exc:  # noqa: BLE001 - the engine's own failure, told as such
            self._fail(exc, "the last step, at exit")

    def close_partial(self) -> None:
        """At exit of a loop that never stepped: what was recorded becomes one step (why,
        the watch says: `foreign_steps`)."""
        self._boundary.close(None)
