"""A watched model pickles, saves (`torch.save`), copies (`copy.deepcopy`) and scripts
(`torch.jit.script`) as it would unwatched: its state leaves out the hooks this engine put
on it.

A module keeps its hooks in dicts of its own, and pickling or copying a module takes its
`__dict__`: the engine's hooks would carry the probe into a checkpoint (where pickling fails,
hook functions not being importable by name) and into every copy, which would then report
into the watch. While any watch holds hooks, `nn.Module.__getstate__` gives the state without
them (a copy of each hook dict that holds one); the module itself and everyone else's hooks
are untouched. TorchScript compiles a module's forward hooks with it, and the engine's are
Python it cannot compile: while any watch holds hooks, `torch.jit.script` of a module sets
them aside for the compilation (the scripted module has the model's own hooks alone) and
puts them back.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
              "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
              "_backward_hooks", "_backward_pre_hooks")
"""The attributes of `nn.Module` where hooks are kept by their handle's id."""

_own: set[int] = set()
_module_getstate = nn.Module.__getstate__


def _getstate(self: nn.Module) -> dict[str, Any]:
    state = _module_getstate(self)
    if _own:
        for name in HOOK_DICTS:
            hooks = state.get(name)
            if hooks and not _own.isdisjoint(hooks):
                state[name] = OrderedDict((k, v) for k, v in hooks.items() if k not in _own)
    return state


@contextmanager
def _set_aside(module: nn.Module) -> Iterator[None]:
    """The engine's hooks out of `module`'s and its children's hook dicts, then back."""
    taken = []
    for m in module.modules():
        for name in HOOK_DICTS:
            hooks = getattr(m, name, None)
            if hooks and not _own.isdisjoint(hooks):
                taken.append((hooks, OrderedDict(hooks)))
                for k in [k for k in hooks if k in _own]:
                    del hooks[k]
    try:
        yield
    finally:
        for hooks, before in taken:
            hooks.clear()
            hooks.update(before)


_jit_script: Callable[..., Any] | None = None
"""`torch.jit.script` as it was before the engine wrapped it (`_script`)."""


def _wrap_script(script: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(script)
    def _script(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, nn.Module) and _own:
            with _set_aside(obj):
                return script(obj, *args, **kwargs)
        return script(obj, *args, **kwargs)

    return _script


def own(handle: RemovableHandle) -> RemovableHandle:
    """Leave the hook of `handle` out of every module's pickled or copied state, and of
    what `torch.jit.script` compiles."""
    global _jit_script
    _own.add(handle.id)
    if nn.Module.__getstate__ is not _getstate:
        nn.Module.__getstate__ = _getstate  # type: ignore[method-assign]
    if _jit_script is None:
        _jit_script = torch.jit.script
        torch.jit.script = _wrap_script(_jit_script)
    return handle


def release(handle: RemovableHandle) -> None:
    """Forget `handle` (its hook removed); with no hook left, `nn.Module` pickles as PyTorch
    made it (unless another library has wrapped `__getstate__` since: then it stays a
    pass-through, which leaves the state as it is), and `torch.jit.script` is PyTorch's
    again (the same: a wrapper of the program's around ours stays)."""
    global _jit_script
    _own.discard(handle.id)
    if not _own and nn.Module.__getstate__ is _getstate:
        nn.Module.__getstate__ = _module_getstate  # type: ignore[method-assign]
    if not _own and _jit_script is not None:
        if getattr(torch.jit.script, "__wrapped__", None) is _jit_script:
            torch.jit.script = _jit_script  # type: ignore[assignment]
        _jit_script = None
