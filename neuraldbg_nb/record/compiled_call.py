"""The call hooks of a module compiled in place (`model.compile()`), kept outside its
compiled graph (`CallWrapped`).

`model.compile()` compiles the module's whole call, its hooks included: a forward hook or
pre-hook on it, even one that does nothing, changes the graphs inductor builds, and with
them the random numbers its dropout draws, so the training would differ from the first
step. Its compiled call is wrapped instead: the watch's pre- and post-call functions run
around it, and the compiled function itself is the one the training has without the
watch. Its layers' own hooks are left in: a compiled graph does not run them
(`Forward.post` says so) and they do not change it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle


def compiled_in_place(module: nn.Module) -> bool:
    """Is `module`'s call compiled in place (`module.compile()`)?"""
    return module.__dict__.get("_compiled_call_impl") is not None


class CallWrapped(RemovableHandle):
    """`pre(module, args, kwargs)` before and `post(module, args, output)` after each
    call of a module compiled in place (`post` also where the call raised, with output
    None), as forward hooks (`with_kwargs`, `always_call`) would run; `remove` puts the
    compiled call back. A module's pickled or copied state never holds its compiled call
    (`nn.Module.__getstate__` leaves it out), so neither holds the wrapper."""

    def __init__(self, module: nn.Module, pre: Callable[..., Any],
                 post: Callable[..., Any]) -> None:
        super().__init__(OrderedDict())
        self._module = module
        compiled = self._compiled = module.__dict__["_compiled_call_impl"]

        def call(*args: Any, **kwargs: Any) -> Any:
            pre(module, args, kwargs)
            out = None
            try:
                out = compiled(*args, **kwargs)
            finally:
                post(module, args, out)
            return out

        self._call = call
        module._compiled_call_impl = call

    def remove(self) -> None:
        if self._module.__dict__.get("_compiled_call_impl") is self._call:
            self._module._compiled_call_impl = self._compiled
        super().remove()
