"""The layers' forward hooks of one probe, put on and taken off at step boundaries.

Where the layer hooks are on for some steps only (`Boundary`), they go on and off every
few steps. Registering a hook and removing it again costs about 8 us a layer (a handle, a
weak reference, the bookkeeping of `pickling`): a millisecond a toggle for a model of 121
layers. Here each layer's hook is registered once; taking it off removes its entry from
the module's hook dict and putting it on puts the same entry back under the same id, a
fraction of a microsecond a layer. The ids stay those the probe owns (`Probe._owned`:
`pickling` leaves them out of pickles and copies, `replay` tells them from the model's
own hooks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch.utils.hooks import RemovableHandle

from .discovery import Candidate

Post = Callable[[Candidate, Any, tuple, object], None]
"""The layer hook (`Forward.post`), called with the layer's candidate first."""


class LayerHooks:
    """Each watched layer's forward hook, registered once, on or off as a whole."""

    def __init__(self, post: Post, owned: Callable[[RemovableHandle], RemovableHandle],
                 unhook: Callable[[list[RemovableHandle]], None]) -> None:
        """`post`: the hook; `owned`: marks a hook as the probe's; `unhook`: removes the
        probe's hooks for good."""
        self._post = post
        self._owned = owned
        self._unhook = unhook
        self._made: dict[int, tuple[Candidate, RemovableHandle, Callable[..., None]]] = {}
        self._on: list[RemovableHandle] = []

    def on(self, layers: list[Candidate]) -> None:
        """Put the hooks of `layers` on (each layer's is made the first time)."""
        made = self._made
        for c in layers:
            entry = made.get(id(c))
            if entry is None:
                fn: Callable[..., None] = functools.partial(self._post, c)
                h = self._owned(c.module.register_forward_hook(fn))
                made[id(c)] = (c, h, fn)
            else:
                _, h, fn = entry
                hooks = h.hooks_dict_ref()
                if hooks is None:
                    continue
                hooks[h.id] = fn
            self._on.append(h)

    def whole(self, layers: list[Candidate]) -> None:
        """`layers` are every watched layer now: the hooks of any other (a layer the loop
        replaced) are removed for good, and what they hold is let go."""
        stale = self._made.keys() - {id(c) for c in layers}
        if stale:
            self._unhook([self._made.pop(key)[1] for key in stale])

    def off(self) -> None:
        """Take every hook off (each stays made, to be put on again)."""
        for h in self._on:
            hooks = h.hooks_dict_ref()
            if hooks is not None:
                hooks.pop(h.id, None)
        self._on = []

    def remove(self) -> None:
        """Remove every hook for good (the probe detaches)."""
        self.off()
        self._unhook([h for _, h, _ in self._made.values()])
        self._made = {}
