"""The watched models: their roots (given to the watch, or found as they are first called),
their layers, numbered in forward order, and each layer's weights.

A root is the module the loop calls. Wrappers that add nothing to a layer's health
(torch.compile's `OptimizedModule`, `DistributedDataParallel`, `DataParallel`) are looked
through (`unwrapped`): the layers are the user's model's and are named as it names them,
while the hooks on the root stay on the wrapper, which is what the loop calls.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from torch import nn

from ..trace.columns import Trace
from .layers import (
    acts_by_mode,
    bounds_of,
    composite,
    is_nonnegative,
    iter_layers,
    own_named_params,
    own_params,
    role_of,
)

Owner = tuple[str, nn.Parameter, int]
"""A watched weight: its qualified name, the parameter, the id of its layer's module."""


@dataclass
class Candidate:
    """A module watched as a layer, with what its forward hook reads of it every call."""

    name: str
    module: nn.Module
    role: str
    bounds: tuple[float, float] | None
    nonneg: bool
    relu: bool  # exactly nn.ReLU: its max is the max of its input, floored at 0
    composite: bool = False  # code of its own around its children (`layers.composite`)
    root: bool = False  # the model itself (as it is called, inside its wrappers)
    weightless: bool = False  # no weights of its own: measured at its first call of a
    # forward only (`Forward.post`)
    index: int = -1  # the trace's layer index, given at the first call (forward order)
    fewest: int = sys.maxsize  # the fewest elements a call output (`LayerInfo.outputs`)


class Models:
    """The roots of one watch, their layers and their weights.

    The containers (`roots`, `candidates`, `index`, `owners`, `other_lr`) are shared by
    reference with the parts that read them on every call (the forward hooks, the step
    owner, the weight probe): they change in place, as models are found and as a loop
    replaces a layer or a weight inside the watch (`rescan`); `version` counts the changes
    of `owners`, for the parts that cache what they read of it."""

    def __init__(self, trace: Trace, given: bool) -> None:
        """`given`: the watch was given its models; without, they are found as they run
        (`discover`)."""
        self.trace = trace
        self.given = given
        self.roots: set[int] = set()  # ids of the roots, as the loop calls them
        self.root_modules: list[nn.Module] = []
        self.modal: list[tuple[nn.Module, list[nn.Module]]] = []
        """Each root (its module, compiled or not) with its layers that act by mode."""
        self.candidates: dict[int, Candidate] = {}  # module id -> its layer
        self.index: dict[int, int] = {}  # module id -> trace index, once numbered
        self.owners: list[Owner] = []
        self.other_lr: set[int] = set()
        """Modules whose weights another optimizer trains, not the primary: their layers'
        learning rate is not the step's (`LayerInfo.primary_lr`; `StepOwner`)."""
        self._params: list[tuple[str, nn.Parameter, int]] = []
        self._params_version = -1
        self._prefixes: list[str] = []
        self.version = 0
        """Incremented whenever `owners` changes."""

    def add_root(self, root: nn.Module, prefix: str) -> list[Candidate]:
        """Register root's layers and weights, their names under `prefix`; the layers
        that are new."""
        self.roots.add(id(root))
        self.root_modules.append(root)
        self._prefixes.append(prefix)
        self.version += 1
        root = unwrapped(root)
        self.modal.append((root, [m for m in root.modules() if acts_by_mode(m)]))
        seen = {id(p) for _, p, _ in self.owners}
        new = []
        for name, m in iter_layers(root, prefix):
            if id(m) in self.candidates:
                continue
            new.append(self._candidate(name, m, m is root))
            for pname, p in own_named_params(m):
                if id(p) not in seen:
                    seen.add(id(p))
                    self.owners.append((f"{name}.{pname}", p, id(m)))
        return new

    def _candidate(self, name: str, m: nn.Module, root: bool) -> Candidate:
        """A layer first seen, registered under `name` (`root`: the model itself)."""
        c = self.candidates[id(m)] = Candidate(name, m, role_of(m), bounds_of(m),
                                               is_nonnegative(m), type(m) is nn.ReLU,
                                               composite(m), root, weightless=not own_params(m))
        return c

    def discover(self, module: nn.Module) -> list[Candidate]:
        """A model found as it is first called (no model given): the first one's layers
        are named as it names them, the next ones' under its class name and number
        ("Sequential1.0"). Its layers that are new."""
        n = len(self.root_modules)
        return self.add_root(module, "" if n == 0 else f"{type(module).__name__}{n}.")

    def layer(self, mid: int) -> int:
        """The trace index of the layer of module id `mid`, numbered at its first call."""
        idx = self.index.get(mid)
        if idx is None:
            c = self.candidates[mid]
            own = own_params(c.module)
            replaced = c.name in self.trace.layer_names  # (by `rescan`: the step now)
            idx = c.index = self.trace.add_layer(
                c.name, type(c.module).__name__, c.role, bool(own),
                primary_lr=mid not in self.other_lr, params=sum(p.numel() for p in own))
            if replaced:
                self.trace.update_layer(idx, since=self.trace.n_steps,
                                        type=type(c.module).__name__, role=c.role,
                                        has_params=bool(own), params=sum(p.numel() for p in own))
            self.index[mid] = idx
        return idx

    def params(self) -> list[tuple[str, nn.Parameter, int]]:
        """(name, parameter, layer index) of every watched weight; rebuilt only when a
        model is found or a layer or weight replaced (`rescan`)."""
        if self._params_version != self.version:
            self._params = [(name, p, self.layer(mid)) for name, p, mid in self.owners]
            self._params_version = self.version
        return self._params

    def rescan(self) -> list[Candidate]:
        """Walk the roots again for layers and weights the loop replaced inside the watch
        (`model[4] = nn.Linear(...)`, `layer.weight = nn.Parameter(...)`): a new layer
        under an old name keeps that name's trace column; `owners` becomes the weights
        the models hold now (`version` moves only where they differ). A layer that left
        the models is no longer watched. The layers that are new. Costs one walk of the
        models' modules: asked when a step's gradients suggest a change, not every step
        (`Boundary`)."""
        owners: list[Owner] = []
        new: list[Candidate] = []
        walked: set[int] = set()
        seen: set[int] = set()
        modal = []
        for root, prefix in zip(self.root_modules, self._prefixes):
            inner = unwrapped(root)
            modal.append((inner, [m for m in inner.modules() if acts_by_mode(m)]))
            for name, m in iter_layers(inner, prefix):
                if id(m) in walked:
                    continue
                walked.add(id(m))
                if id(m) not in self.candidates:
                    new.append(self._candidate(name, m, m is inner))
                for pname, p in own_named_params(m):
                    if id(p) not in seen:
                        seen.add(id(p))
                        owners.append((f"{name}.{pname}", p, id(m)))
        self.modal = modal
        for mid in [mid for mid in self.candidates if mid not in walked]:
            del self.candidates[mid]
        if [(id(p), mid) for _, p, mid in owners] != \
                [(id(p), mid) for _, p, mid in self.owners]:
            self.owners[:] = owners
            self.version += 1
        return new

    def layers_in_eval(self) -> int:
        """Layers that act by mode (`acts_by_mode`: dropout, BatchNorm) found in eval mode,
        in the watched models that have weights to train and are in eval mode themselves
        (asked as a backward starts): a model left in `model.eval()` after an evaluation
        trains without dropout, and its BatchNorm normalises with running statistics it no
        longer updates. Not counted: a layer put in eval mode on purpose inside a model in
        training mode (BatchNorm frozen while fine-tuning), a frozen model kept in eval
        mode (a teacher, a perceptual loss network). One attribute read per model when all
        is well."""
        n = 0
        for root, modal in self.modal:
            if modal and not root.training and any(p.requires_grad for p in root.parameters()):
                n += sum(not m.training for m in modal)
        return n


_WRAPPERS = (nn.parallel.DistributedDataParallel, nn.DataParallel)


def unwrapped(root: nn.Module) -> nn.Module:
    """The model inside the wrappers that add nothing to a layer's health: torch.compile's
    OptimizedModule (`_orig_mod`), DistributedDataParallel and DataParallel (`module`), in
    any nesting. Its layers are named as the user's model names them ("encoder.0", not
    "module._orig_mod.encoder.0")."""
    while True:
        inner = root.module if isinstance(root, _WRAPPERS) else getattr(root, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return root
        root = inner
