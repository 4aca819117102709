"""A watched model pickles, saves (`torch.save`) and copies (`copy.deepcopy`) as it would
unwatched: its state leaves out the hooks this engine put on it.

A module keeps its hooks in dicts of its own, and pickling or copying a module takes its
`__dict__`: the engine's hooks would carry the probe into a checkpoint (where pickling fails,
hook functions not being importable by name) and into every copy, which would then report
into the watch. While any watch holds hooks, `nn.Module.__getstate__` gives the state without
them (a copy of each hook dict that holds one); the module itself and everyone else's hooks
are untouched.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

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


def own(handle: RemovableHandle) -> RemovableHandle:
    """Leave the hook of `handle` out of every module's pickled or copied state."""
    _own.add(handle.id)
    if nn.Module.__getstate__ is not _getstate:
        nn.Module.__getstate__ = _getstate  # type: ignore[method-assign]
    return handle


def release(handle: RemovableHandle) -> None:
    """Forget `handle` (its hook removed); with no hook left, `nn.Module` pickles as PyTorch
    made it (unless another library has wrapped `__getstate__` since: then it stays a
    pass-through, which leaves the state as it is)."""
    _own.discard(handle.id)
    if not _own and nn.Module.__getstate__ is _getstate:
        nn.Module.__getstate__ = _module_getstate  # type: ignore[method-assign]
