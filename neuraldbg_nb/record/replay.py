"""Replay of a step's forward: the per-layer summaries of a step whose layers were not
hooked, computed at that step, before its update.

Each top-level training call of a watched model is remembered for the step (`Replay.record`,
from the root's pre-hook): references to its arguments (no copy), their in-place versions,
the RNG states it started from (the CPU's and each initialised accelerator's) and the
autocast state it ran under. When the step's cheap signals say it went wrong
(`anomalous`), `Replay.run` calls the same forwards again, in order, with the layer hooks
on, under `torch.no_grad()`: the weights are still those the forward used (the replay runs
in the optimizer's pre-hook, before the update), dropout draws the same masks from the
restored RNG, BatchNorm in train mode normalises by the same batch statistics, and autocast
picks the same dtypes, so each layer's output is the one the training computed, bit for bit.
What a forward changes is put back afterwards (`replay_state.Saved`): every buffer of the
model (running statistics, counters), the random states (torch's, Python's, numpy's, a
generator a module holds) and the modules' own attributes (a counter of calls, a list
logged to), so the training goes on as if no replay had run; its warnings are not shown.

A replay is refused, with the reason (`Replay.refusal`), where it cannot be exact or
safe: a sharded model (FSDP gathers its weights in collectives), arguments changed in
place since the forward (their `_version` moved), or a forward that raises when run again.
It runs without the model's own forward hooks (the user's or a library's would hear the
call a second time: `replay_hooks.Unhooked`), and a random generator passed to the
forward (`forward(x, generator=g)`) draws from where it stood at the call and is left
where the training left it. Its numbers are not used where a call's output differs from
the one the training got (`output_seen`, `same_output`): a forward that reads state the
loop changed after it (a flag set after `backward()`), draws random numbers outside
torch's generators (Python's `random`, numpy's), or whose hooks change what it computes
ran another way the second time. A wrapper (DistributedDataParallel, torch.compile's
module) is looked through: the module inside it is replayed (`discovery.unwrapped`), so
no collective runs.

The same replay, with a layer's output replaced, tells whether that output makes the
model's output what it is (`Replay.reaches`): asked once for a layer that gets no gradient
while layers before it do, to tell an output added detached from one left unused.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .discovery import unwrapped
from .layers import first_tensor, tensors_in
from .reductions import dense
from .replay_hooks import Unhooked
from .replay_state import Saved, generator_state, rng_state, set_generator_state, set_rng_state

_DEVICE_TYPES = ("cpu", "cuda")
"""Autocast states remembered (the device types a forward runs under autocast on)."""


def _autocast_state() -> tuple[tuple[str, bool, torch.dtype], ...]:
    return tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                 for d in _DEVICE_TYPES if _has(d))


def _has(device_type: str) -> bool:
    return device_type == "cpu" or (device_type == "cuda" and torch.cuda.is_initialized())


_PLAIN = (int, float, str, bytes, type(None))
"""Arguments that are no random generator, told at once (a list of lengths)."""


def _arguments(args: tuple, kwargs: dict
               ) -> tuple[list[torch.Tensor], list[tuple[Any, Any]]]:
    """The tensors among the call's arguments, one level into lists, tuples and dicts;
    and the random generators there (torch's, numpy's, Python's), each with its state
    now."""
    tensors: list[torch.Tensor] = []
    generators: list[tuple[Any, Any]] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            continue
        items = a if isinstance(a, (list, tuple)) else \
            a.values() if isinstance(a, dict) else (a,)
        for x in items:
            if isinstance(x, torch.Tensor):
                tensors.append(x)
            elif not isinstance(x, _PLAIN) and (state := generator_state(x)) is not None:
                generators.append((x, state))
    return tensors, generators


def _sharded(module: nn.Module) -> bool:
    """FSDP (the wrapper, or modules sharded by `fully_shard`): its forward gathers the
    weights in collectives, which a replay on one rank would hang in."""
    return any("FullyShardedDataParallel" in type(m).__name__ or
               type(m).__name__.startswith("FSDP") for m in module.modules())


Seen = tuple[torch.Tensor, torch.Tensor]
"""A call's output's fingerprint (`output_seen`): its min and max, on its device."""


@dataclass
class Call:
    """One top-level training call of a watched model, as the step made it."""

    root: nn.Module
    args: tuple
    kwargs: dict
    versions: list[int]
    rng: tuple[torch.Tensor, list[torch.Tensor] | None]
    autocast: tuple[tuple[str, bool, torch.dtype], ...]
    tensors: list[torch.Tensor] = field(default_factory=list)
    generators: list[tuple[Any, Any]] = field(default_factory=list)
    """The random generators among its arguments, with their states at the call."""
    seen: Seen | None = None
    """Its output's fingerprint (`output_seen`), taken when it returned a large one."""
    out: torch.Tensor | None = None
    """Its output where it is small (`CHECKED`) and no view of a larger tensor, held
    (detached) until the step ends: its fingerprint is taken only where the step is
    replayed."""
    out_version: int = 0
    """`out`'s in-place version when the call returned."""
    spare: tuple[int, torch.Tensor, int] | None = None
    """Beside a small `out`, the output's next floating-point tensor (a language model's
    logits beside its loss): its place among the output's tensors (`tensors_in`), the
    tensor (detached, held until the step ends) and its version then; what a replay
    compares where `out` was changed in place since (the Trainer scales the loss it is
    given in place)."""
    nodes: list[Any] | None = None
    """Where its output holds several floating-point tensors, the autograd node each one
    came from (None for one that has none), in `tensors_in`'s order: which of them the
    step's loss was computed from is read from these (`Replay.used_outputs`)."""

    @property
    def module(self) -> nn.Module:
        """The module a replay calls: the model inside its wrappers
        (`discovery.unwrapped`), looked up only where the step is replayed."""
        return unwrapped(self.root)

    def fingerprint(self) -> Seen | None:
        """The fingerprint of the output the training got (`output_seen`); None where it
        is not known (none told, or a small one changed in place since)."""
        if self.out is not None and self.out._version == self.out_version:
            return output_seen(checked(self.out))
        return self.seen


CHECKED = 4096
"""Elements of a call's output whose extremes fingerprint it (`output_seen`): a forward
that runs another way changes them as surely as the whole output's, and reading a fixed
slice costs a language model's logits no more than a classifier's ten."""

GRAPH_NODES = 100_000
"""Autograd nodes walked at most to tell which of a step's outputs its loss was computed
from (`Replay.used_outputs`): a tenth of a second of Python, once for a layer's reach
test; a transformer of a dozen blocks has a few thousand."""

SAME = 1e-3
"""Relative difference within which a replayed output's extremes are the training's
(`same_output`): on the CPU a replay is exact, but a compiled model is replayed eagerly,
and an accelerator's atomic adds sum in another order."""


def checked(output: object) -> torch.Tensor | None:
    """The tensor of a call's output whose values fingerprint it (`output_seen`): its first
    floating-point one; None where there is none, or it is not a plain tensor with memory
    of its own (a wrapper such as a DTensor would run a collective)."""
    t = first_tensor(output)
    if t is None or type(t) not in (torch.Tensor, nn.Parameter) or t.numel() == 0 \
            or t.layout != torch.strided or t.is_quantized:
        return None
    return t


def output_seen(t: torch.Tensor | None) -> Seen | None:
    """(min, max) of the first `CHECKED` elements, in memory order, of a call's output's
    `checked` tensor, on its device (read on the host only where a replay compares
    them); None where there is none, or its memory has gaps."""
    if t is None:
        return None
    t = t.detach()
    if t.numel() <= CHECKED:  # all of it, in any order
        return torch.aminmax(t)
    flat = dense(t)
    if flat is None:
        return None
    return torch.aminmax(flat.view(-1)[:CHECKED])


def same_output(was: Seen, now: Seen | None) -> bool:
    """Is the replay's output (`now`, None where it has no fingerprint) the one the
    training got (`was`), by their fingerprints (`output_seen`, read on the host in one
    transfer)? Each extreme equal within `SAME` of the output's extent (the larger
    magnitude of the four: an extreme near 0 moves by rounding as much as the others),
    or not finite alike (a NaN where the training's had one)."""
    if now is None:
        return False
    v = torch.stack([t.to(torch.float64 if t.dtype == torch.float64 else torch.float32,
                          copy=False).to(was[0].device) for t in (*was, *now)]).tolist()
    extent = max((abs(x) for x in v if math.isfinite(x)), default=0.0)
    for x, y in zip(v[:2], v[2:]):
        if x == y or (math.isnan(x) and math.isnan(y)):
            continue
        if not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) > SAME * extent:
            return False
    return True


class Replay:
    """The step's training calls, and their replay at an anomalous step."""

    def __init__(self, own: set[int] | None = None,
                 names: Callable[[nn.Module], str | None] | None = None) -> None:
        """`own`: the ids of the watch's own hooks on modules (the layer and root hooks),
        kept up to date by the probe; any other forward hook is the model's own. `names`:
        a module's name as the watch names its layers (None where it is no layer), for
        the reasons it gives."""
        self._own = own if own is not None else set()
        self._names = names
        self.calls: list[Call] = []
        self.active = False
        """A replay is running: the root hooks record nothing (its input is the step's)."""
        self.replays = 0
        """Replays run in this watch."""
        self.refused: str | None = None
        """The first reason a replay was refused (`refusal`), for `run.notes`."""

    def new_step(self) -> None:
        """A step starts: the last step's calls (and the references to its inputs) go."""
        self.calls = []

    def record(self, root: nn.Module, args: tuple, kwargs: dict) -> None:
        """A top-level training call of `root` begins (its pre-hook): remembered by
        reference, with the RNG and autocast state it starts from."""
        ts, generators = _arguments(args, kwargs)
        self.calls.append(Call(root, args, dict(kwargs), [t._version for t in ts],
                               rng_state(), _autocast_state(), ts, generators))

    def returned(self, output: object) -> None:
        """The call last recorded returned `output`, at any step: where it holds several
        floating-point tensors (a tuple, a dict), the autograd node of each is kept for
        the step (`Call.nodes`), so that a reach test compares the outputs the loss was
        computed from (`used_outputs`). A tensor alone costs nothing here."""
        if type(output) is torch.Tensor or not self.calls:
            return
        ts = [t for t in tensors_in(output) if t.is_floating_point()]
        if len(ts) > 1:
            self.calls[-1].nodes = [t.grad_fn for t in ts]

    def used_outputs(self, roots: Sequence[Any]) -> list[list[int] | None]:
        """Per call of the step, which of its output's floating-point tensors (their
        places among them) the step's losses were computed from, found by walking the
        losses' autograd graphs from `roots` (their nodes, as the backwards began; at
        most `GRAPH_NODES` nodes are walked); None for a call whose output is one tensor,
        or where it cannot be told (no loss heard, a graph too large to walk). A model
        returning `(embedding, logits)` whose loss reads the logits alone is judged by
        its logits: a layer that feeds only the embedding is unused, not detached."""
        wanted = {id(n) for c in self.calls for n in (c.nodes or ()) if n is not None}
        if not wanted or not roots:
            return [None] * len(self.calls)
        found: set[int] = set()
        seen: set[int] = set()
        todo = [n for n in roots if n is not None]
        while todo and len(found) < len(wanted):
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if len(seen) > GRAPH_NODES:
                return [None] * len(self.calls)
            if id(node) in wanted:
                found.add(id(node))
            todo.extend(n for n, _ in node.next_functions if n is not None)
        return [None if c.nodes is None else
                [i for i, n in enumerate(c.nodes) if n is not None and id(n) in found]
                for c in self.calls]

    def output(self, output: object) -> None:
        """The call last recorded returned `output`: what a replay of the step compares
        its own with (`run`): a small output itself, by reference, a large one's
        fingerprint. The probe tells it only at steps whose layers are not hooked: only
        those are replayed."""
        t = first_tensor(output)
        if t is None or not self.calls:
            return
        call = self.calls[-1]
        if t._base is None and t.numel() <= CHECKED:  # (a view would hold its base)
            call.out = t.detach()
            call.out_version = t._version
            if type(output) is not torch.Tensor:
                ts = tensors_in(output)
                at = next((i for i, u in enumerate(ts) if u is t), len(ts))
                k = next((i for i in range(at + 1, len(ts)) if ts[i].is_floating_point()), -1)
                if k >= 0:
                    call.spare = (k, ts[k].detach(), ts[k]._version)
        else:
            call.seen = output_seen(checked(t))

    def refusal(self) -> str | None:
        """Why the step's calls cannot be replayed exactly, or None where they can."""
        if not self.calls:
            return "no call of the model was heard in the step"
        for c in self.calls:
            if _sharded(c.module):
                return "a sharded model (FSDP) is not replayed: its forward runs collectives"
            if any(t._version != v for t, v in zip(c.tensors, c.versions)):
                return ("the model's inputs were changed in place after its forward, so its "
                        "forward cannot be run again as it ran")
        return None

    def run(self, arm: Callable[[], None], disarm: Callable[[], None]) -> bool:
        """Replay the step's calls in order with the layer hooks on (`arm`, `disarm`):
        False (and `refused` set once) where it cannot be exact (`refusal`) or its
        forward raises when run again. The RNG states and every buffer of the replayed
        models are as they were before it, whatever happened."""
        wases = [c.fingerprint() for c in self.calls]  # (before the forward runs again)
        pairs: list[tuple[Seen, Seen | None]] = []  # (the training's, the replay's)

        def compare(k: int, c: Call, out: object) -> None:
            was = wases[k]
            if was is not None:
                pairs.append((was, output_seen(checked(out))))
            elif c.spare is not None and c.spare[1]._version == c.spare[2]:
                at, spare, _ = c.spare
                again = tensors_in(out)
                seen = output_seen(checked(spare))
                if seen is not None:
                    pairs.append((seen, output_seen(checked(again[at]))
                                  if at < len(again) else None))

        unhooked = self._again(arm, disarm, compare, note=True)
        if unhooked is None:
            return False
        if not all(same_output(was, now) for was, now in pairs):
            if self.refused is None and unhooked.skipped is not None:
                self.refused = (f"its forward gave another output when run without the "
                                f"forward hooks of its own ({unhooked.skipped}'s: they would "
                                f"hear the call again), which change what it computes")
            elif self.refused is None:
                self.refused = (
                    "its forward gave another output when run again: it reads state that "
                    "changed after it, such as a flag the loop sets after backward(), or "
                    "draws random numbers outside torch's generators, such as Python's "
                    "random or numpy's")
            return False
        self.replays += 1
        return True

    def reaches(self, modules: Sequence[nn.Module],
                used: Sequence[list[int] | None] = ()) -> list[bool | None]:
        """Whether each of `modules` (layers of the step's models) makes the step's
        outputs what they are: the step's calls replayed as they ran, then with the
        outputs of all of `modules` replaced (`Replaced`), then, where those outputs
        moved, with each one's alone, then as they ran again. True where the outputs of
        a module's replay differ from the two plain ones, which agree; False where they
        do not differ (all of them, where replacing all of them moved nothing); None
        where it cannot be told (a replay refused or raising, plain replays that
        disagree, an output no tensor of which is fingerprinted, a module whose output
        cannot be replaced). It tells an output that enters the model's output only
        detached (`h + block(h).detach()`, whose weights get no gradient) from one left
        unused (a pooler): neither gets a gradient. Three forwards under
        `torch.no_grad()`, and one per module where one is used: asked once per such
        layer (`membership.Membership.cut`). Nothing of the training changes (see
        `run`). `used`: per call, the places of the output's floating-point tensors the
        loss was computed from (`used_outputs`), the ones compared; a call's first one
        where its entry is None or missing."""
        def fingerprints(into: list[Seen | None]) -> Callable[[int, Call, object], None]:
            def each(k: int, c: Call, out: object) -> None:
                pick = used[k] if k < len(used) else None
                if pick is None:
                    into.append(output_seen(checked(out)))
                    return
                ts = [t for t in tensors_in(out) if t.is_floating_point()]
                into.extend(output_seen(checked(ts[i])) if i < len(ts) else None
                            for i in pick)
            return each

        def replaced(which: Sequence[nn.Module]) -> list[Seen | None] | None:
            hooks = Replaced(which)
            seen: list[Seen | None] = []
            ran = self._again(hooks.arm, hooks.disarm, fingerprints(seen), note=False)
            return seen if ran is not None and hooks.done else None

        untold: list[bool | None] = [None] * len(modules)
        first: list[Seen | None] = []
        if not modules or self._again(_nothing, _nothing, fingerprints(first),
                                      note=False) is None or not first:
            return untold  # (nothing to compare: no output the loss was computed from)
        together = replaced(modules)
        if together is None:
            return untold
        if _alike(first, together):
            told: list[bool | None] = [False] * len(modules)
        elif len(modules) == 1:
            told = [True]
        else:
            each = [replaced([m]) for m in modules]
            told = [None if seen is None else not _alike(first, seen) for seen in each]
        last: list[Seen | None] = []
        if self._again(_nothing, _nothing, fingerprints(last), note=False) is None \
                or not _alike(first, last):
            return untold
        return told

    def _again(self, arm: Callable[[], None], disarm: Callable[[], None],
               each: Callable[[int, Call, object], None], note: bool) -> Unhooked | None:
        """Call the step's calls again, in order, each from the RNG, generator and
        autocast state it started from, under `torch.no_grad()` and without the model's
        own forward hooks, with `arm` called first and `disarm` last (also on errors);
        `each(k, call, output)` sees each call's output. What the forwards changed is put
        back (`replay_state.Saved`). None where it cannot run (`refusal`), raised, or
        changed tensors too large to put back (the reason in `refused` where `note`);
        otherwise the hooks set aside (`Unhooked.skipped`)."""
        why = self.refusal()
        if why is not None:
            if note and self.refused is None:
                self.refused = why
            return None
        modules = list({id(m): m for m in (c.module for c in self.calls)}.values())
        saved = Saved(modules, [g for c in self.calls for g, _ in c.generators])
        unhooked = Unhooked(modules, self._own, self._names)
        self.active = True
        try:
            with unhooked, saved, torch.no_grad():
                arm()
                for k, c in enumerate(self.calls):
                    set_rng_state(c.rng)
                    for g, state in c.generators:
                        set_generator_state(g, state)
                    with _autocast(c.autocast):
                        out = c.module(*c.args, **c.kwargs)
                    each(k, c, out)
        except Exception as exc:  # noqa: BLE001 (a forward that cannot run twice: not the training's error)
            if note and self.refused is None:
                self.refused = f"its forward raised {type(exc).__name__} when run again"
            return None
        finally:
            disarm()
            self.active = False
        if saved.changed:  # (plain tensors too large to copy before it)
            if note and self.refused is None:
                self.refused = (f"its forward changed {', '.join(saved.changed)} in place "
                                f"when run again, more than a replay copies to put back")
            return None
        return unhooked

    def release(self) -> None:
        self.calls = []


class _autocast:
    """Re-enter the autocast state a forward ran under, for each device type."""

    def __init__(self, state: tuple[tuple[str, bool, torch.dtype], ...]) -> None:
        self._ctx = [torch.autocast(d, dtype=dt, enabled=on) for d, on, dt in state]

    def __enter__(self) -> None:
        for c in self._ctx:
            c.__enter__()

    def __exit__(self, *exc: object) -> None:
        for c in reversed(self._ctx):
            c.__exit__(*exc)


def _nothing() -> None:
    pass


def _alike(a: list[Seen | None], b: list[Seen | None]) -> bool:
    """Are two replays' outputs the same (`same_output`), call by call, each one
    fingerprinted?"""
    return len(a) == len(b) > 0 and all(
        x is not None and same_output(x, y) for x, y in zip(a, b))


class Replaced:
    """Forward hooks on `modules`, while armed, that replace each one's output, its first
    floating-point tensor (the output itself, or an item of the tuple or list it
    returns), by a ramp far outside its values (`Replay.reaches`): a thousand times its
    largest magnitude, and not constant along any dimension, so that no normalisation
    after it takes the change out. `done`: an output was replaced."""

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        self._modules = modules
        self._handles: list[Any] = []
        self.done = False

    def arm(self) -> None:
        self._handles = [m.register_forward_hook(self) for m in self._modules]

    def disarm(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __call__(self, module: nn.Module, args: tuple, output: object) -> object:
        if isinstance(output, torch.Tensor):
            return self._ramp(output) if output.is_floating_point() else None
        if isinstance(output, (tuple, list)):
            items = list(output)
            for k, item in enumerate(items):
                if isinstance(item, torch.Tensor) and item.is_floating_point():
                    items[k] = self._ramp(item)
                    if hasattr(output, "_fields"):  # a named tuple
                        return type(output)(*items)
                    return type(output)(items)
        return None

    def _ramp(self, t: torch.Tensor) -> torch.Tensor:
        scale = (t.detach().abs().amax().float() + 1.0) * 1e3 if t.numel() else 1.0
        self.done = True
        ramp = torch.linspace(-1.0, 2.0, t.numel(), device=t.device, dtype=torch.float32)
        return (ramp * scale).to(t.dtype).view(t.shape)


RECENT = 8
"""Steps before a step that its every-step numbers are compared with (`anomalous`): their
range, so that a number swinging within its own recent range (a loss near an exact fit,
gradients of a deep network) is not taken for a failure at every swing."""
GRAD_JUMP = 10.0
"""The gradients' total norm (over every layer) that left its recent range by this factor
(above its largest or below its smallest) makes its step worth replaying. A single layer's
move is no such sign: in a deep ReLU network one layer's swings by 10-1000x from batch to
batch while the model is healthy; a forward that went wrong (an activation that jumped, a
weight that blew up) moves the gradients of every layer before it, and the total with
them, unless the layers after it carry most of the total: a layer's gradient cut to
exactly 0 is a sign (`gradient_cut`)."""
LOSS_RISE = math.sqrt(10.0)
"""A loss that rose by this factor above its recent largest (a fall never counts)."""
INPUT_JUMP = math.sqrt(10.0)
"""An input batch whose abs-max moved by this factor or more either way since the step
before (its first layer's output moves with it: `detect.data`)."""
WEIGHT_MOVE = 1.5
"""A layer's weight norm that the last update moved by this factor or more either way
(healthy updates move a weight's norm by a few percent): the step's forward ran on weights
unlike the last measured ones."""
LR_MOVE = 2.0
"""A learning rate that moved by this factor or more at a step's update: the forward after
it is hooked (`Boundary`), as the update is expected to move the weights unlike before."""
# The factors are the recording's own, not read from the thresholds: what is recorded never
# depends on them, so a run re-judged under other thresholds reads the same numbers.


def grad_total(norms: Iterable[float]) -> float:
    """The gradients' total norm from one step's per-layer norms (NaN where no layer was
    measured). A loop over Python floats: right after a training step, with the CPU's
    caches cold, it takes a fraction of numpy's few calls."""
    sq, known, isnan = 0.0, False, math.isnan
    for x in norms:
        if not isnan(x):  # (NaN: not measured)
            sq += x * x
            known = True
    return math.sqrt(sq) if known else math.nan


class Recent:
    """The every-step numbers of the `RECENT` steps before the one closing, kept as the
    steps close (`anomalous` reads their range): reading them back from the trace at
    every step would cost a dozen array calls."""

    def __init__(self) -> None:
        self._rows: deque[tuple[int, float, float, float, bool]] = deque(maxlen=RECENT)

    def add(self, step: int, loss: float, total: float, in_absmax: float,
            finite: bool) -> None:
        """Step `step` closed with this loss, gradients' total norm and input abs-max, and
        its loss and gradients were all finite or not (`finite`)."""
        self._rows.append((step, loss, total, in_absmax, finite))

    def since(self, first: int) -> tuple[list[float], list[float]]:
        """The losses and totals of the steps kept from `first` on."""
        rows = [r for r in self._rows if r[0] >= first]
        return [r[1] for r in rows], [r[2] for r in rows]

    def finite_before(self, step: int) -> bool:
        """Were the every-step numbers of the step before `step` finite (its loss and
        gradients; True where it was not kept: nothing says otherwise)?"""
        if self._rows and self._rows[-1][0] == step - 1:
            return self._rows[-1][4]
        return True

    def input_before(self, step: int) -> float:
        """The input abs-max of the step before `step` (NaN where it was not kept)."""
        if self._rows and self._rows[-1][0] == step - 1:
            return self._rows[-1][3]
        return math.nan


def anomalous(loss: float, loss_heard: bool, grad_finite: bool, total: float,
              recent_loss: Sequence[float], recent_total: Sequence[float], *,
              inputs: tuple[float, float] = (math.nan, math.nan),
              weights: tuple[list[float], list[float]] = ([], []),
              cut: bool = False) -> bool:
    """Do the every-step numbers of a step say that its forward went wrong? A non-finite
    loss or gradient norm (`grad_finite`: every gradient read was finite); a loss that rose
    by `LOSS_RISE` above its largest of the `RECENT` steps before (`recent_loss`); the
    gradients' total norm (`grad_total`) that left the range of theirs (`recent_total`) by
    `GRAD_JUMP`; the input's abs-max (`inputs`: the step before, now) moved by
    `INPUT_JUMP`; a weight norm that the last update moved by `WEIGHT_MOVE` (`weights`:
    per layer, after the update before it and after it; NaN where not measured); a
    layer's gradient cut off at this step (`cut`: `gradient_cut`)."""
    if cut or not grad_finite or (loss_heard and not math.isfinite(loss)):
        return True
    losses = [x for x in recent_loss if x > 0]
    if losses and loss / max(losses) >= LOSS_RISE:
        return True
    totals = [x for x in recent_total if x > 0]
    if totals and total > 0 and (total >= GRAD_JUMP * max(totals)
                                 or total * GRAD_JUMP <= min(totals)):
        return True
    if _moved(*inputs, INPUT_JUMP):
        return True
    return any(_moved(b, w, WEIGHT_MOVE) for b, w in zip(*weights))


def gradient_cut(now: list[float], recent: Sequence[Sequence[float]]) -> bool:
    """Did a layer's gradient norm fall to exactly 0 at this step (`now`, per layer) where
    it was positive at each of the `RECENT` steps before (`recent`: their rows, oldest
    first)? The path from the loss to the layer was cut in this step's forward: an
    activation after it saturated (in float32 a tanh fed 10 or more, a sigmoid fed 17 or
    more, passes back exactly 0), or every unit after it went dead. The gradients' total
    need not move: where the layers after the cut carry most of it, it reads as an
    ordinary step. A layer's gradient is 0 at ordinary steps only where the layer sits
    some steps out (a branch or an expert the batch did not reach): such a layer was 0 at
    a recent step, or not measured (no gradient: NaN), and is no sign here."""
    if len(recent) < RECENT:
        return False
    return any(x == 0.0 and all(row[i] > 0 for row in recent) for i, x in enumerate(now))


def lr_moved(before: float, now: float) -> bool:
    """Did the learning rate move by `LR_MOVE` or more at this step's update?"""
    return _moved(before, now, LR_MOVE)


EDITED = 0.1
"""A weight slice moved outside the optimizer by this fraction of its norm or more (or by
a non-finite amount) makes its step worth replaying (`edited`). Smaller moves (a
hand-written weight decay, a clamp of a few elements) are left to the next measured
step: replaying every step of such a loop would cost a forward each."""


def edited(edited_by: list[float]) -> bool:
    """Was a weight changed outside the optimizer before the step's forward? `edited_by`:
    per layer, the norm of its slice's change since the last update over its norm after
    that update (the row's `w_edited`; NaN: not read, inf: a change of weights that were
    all zeros or became non-finite)."""
    for d in edited_by:
        if d >= EDITED:
            return True
    return False


def _moved(before: float, now: float, jump: float) -> bool:
    """Did a positive value move by `jump` or more either way? (NaN: not measured, moves
    nothing; a finite value that became infinite moved.)"""
    if not (before > 0 and now > 0):
        return False
    q = now / before
    return q >= jump or q <= 1.0 / jump
