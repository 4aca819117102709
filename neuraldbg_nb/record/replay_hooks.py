"""The model's own forward hooks, set aside while a step is replayed (`Unhooked`).

A forward hook of the user's (a logging hook that appends each layer's output to a list)
or of a library's would hear the replayed call a second time: a side effect on the
program. So a replay runs without them: each module's forward hooks and pre-hooks that are
neither the watch's own nor part of the forward itself (`PURE_HOOKS`), and PyTorch's
global module hooks other than the watch's, are taken out for the replay and put back
after it, in their order. A hook that changes what the forward computes (one that returns
a new output, or moves the input) leaves the replay's output unlike the training's, and
the replay compares them (`replay.same_output`): its numbers are then not used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from torch.nn.modules import module as nn_module

PURE_HOOKS = ("WeightNorm", "SpectralNorm")
"""Forward pre-hooks of `torch.nn.utils` that compute a weight from its parts before each
forward: part of the forward itself, so a replay runs them (their buffers are restored)."""


def _globals() -> list[dict[int, Callable[..., Any]]]:
    return [nn_module._global_forward_hooks, nn_module._global_forward_pre_hooks]


class Unhooked:
    """A context that takes the forward hooks of `roots`' modules that are not in `own`
    (the watch's hook ids) nor `PURE_HOOKS` out while it is entered, and puts them back
    when it leaves, whatever the replay did to the hooks of the watch's own meanwhile."""

    def __init__(self, roots: list[nn.Module], own: set[int],
                 names: Callable[[nn.Module], str | None] | None = None) -> None:
        self._own = own
        self._names = names
        self._roots = roots
        self._taken: list[tuple[dict[int, Any], dict[int, Any], set[int]]] = []
        self.skipped: str | None = None
        """The first module whose hooks were set aside (its layer name, "the model" for a
        root, "a global module hook"), for the reason a replay gives; None where none
        was."""

    def __enter__(self) -> None:
        for d in _globals():
            if self._take(d, pure_too=True):
                self.skipped = self.skipped or "a global module hook"
        seen: set[int] = set()
        for root in self._roots:
            for name, m in root.named_modules():
                if id(m) in seen:
                    continue
                seen.add(id(m))
                taken = [self._take(d) for d in (m._forward_hooks, m._forward_pre_hooks)]
                if any(taken) and self.skipped is None:
                    known = self._names(m) if self._names is not None else None
                    self.skipped = known or name or "the model"

    def _take(self, hooks: dict[int, Any], pure_too: bool = False) -> bool:
        """Take the foreign hooks out of `hooks`; whether there were any."""
        foreign = {k for k, h in hooks.items() if k not in self._own
                   and (pure_too or type(h).__name__ not in PURE_HOOKS)}
        if not foreign:
            return False
        self._taken.append((hooks, dict(hooks), foreign))
        for k in foreign:
            del hooks[k]
        return True

    def __exit__(self, *exc: object) -> None:
        for hooks, before, foreign in reversed(self._taken):
            now = dict(hooks)  # the watch's own may have come or gone in between
            merged = {k: now.get(k, h) for k, h in before.items() if k in foreign or k in now}
            merged.update((k, h) for k, h in now.items() if k not in merged)
            hooks.clear()
            hooks.update(merged)
        self._taken.clear()
