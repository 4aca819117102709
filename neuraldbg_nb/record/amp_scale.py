"""The loss under a GradScaler: `scaler.scale(loss).backward()` calls backward on the loss
times the scale (65536 at first, then halved and doubled as steps overflow or not), so the
tensor heard is not the loss the user knows, and its jumps are the scale's.

The scaled tensor is `loss * scale`, an autograd multiplication that saves its second
factor: where that is the very tensor a live GradScaler holds as its scale, the loss is
the root divided by it (exact: the scale is a power of 2). GradScalers are looked for (`gc`) the first
times such a multiplication is heard, a few times at most, so a loss weighted by a tensor
at every step costs no search after them."""

from __future__ import annotations

import gc
import weakref

import torch

SEARCHES = 3
"""Times at most the live GradScalers are looked for."""


class ScaleReader:
    """Finds the unscaled loss behind a GradScaler-scaled backward root."""

    def __init__(self) -> None:
        self._scalers: weakref.WeakSet[torch.amp.GradScaler] = weakref.WeakSet()
        self._searches = 0

    def unscaled(self, root: torch.Tensor) -> torch.Tensor | None:
        """The loss that `root` is the scaled form of, or None where `root` is no
        GradScaler's scaling."""
        fn = root.grad_fn
        if fn is None or type(fn).__name__ != "MulBackward0":
            return None
        try:
            scale = fn._saved_other  # type: ignore[attr-defined]  # (MulBackward0 saves it)
        except (AttributeError, RuntimeError):  # freed, or not saved
            return None
        if not (isinstance(scale, torch.Tensor) and scale.numel() == 1):
            return None
        ptr = scale.data_ptr()
        if not self._known(ptr) and self._searches < SEARCHES:
            self._searches += 1
            kind = torch.amp.GradScaler
            for o in gc.get_objects():  # by type: `isinstance` asks for `__class__`
                if issubclass(type(o), kind):
                    self._scalers.add(o)
        return root.detach() / scale if self._known(ptr) else None

    def _known(self, ptr: int) -> bool:
        for s in self._scalers:
            own = getattr(s, "_scale", None)
            if isinstance(own, torch.Tensor) and own.data_ptr() == ptr:
                return True
        return False
