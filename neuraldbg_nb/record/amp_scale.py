"""The loss under a GradScaler: `scaler.scale(loss).backward()` calls backward on the loss
times the scale (65536 at first, then halved and doubled as steps overflow or not), so the
tensor heard is not the loss the user knows, and its jumps are the scale's.

The scaled tensor is `loss * scale`, an autograd multiplication that saves its second
factor: where that is the very tensor a live GradScaler holds as its scale, the loss is
the root divided by it (exact: the scale is a power of 2). GradScalers are looked for (`gc`) the first
times such a multiplication is heard, a few times at most, so a loss weighted by a tensor
at every step costs no search after them.

The scales themselves are a step's story too: a GradScaler halves its scale at each
iteration whose gradients overflow and skips that optimizer step. `ScaleTrail` keeps the
first and last scale of a step's scaled backwards (queued on the step's one transfer, a
copy each: the scaler updates its scale in place), so a scale that fell from 65536 to
1e-30 with no optimizer step between is seen (`detect.amp`)."""

from __future__ import annotations

import gc
import weakref

import torch

from . import reductions

SEARCHES = 3
"""Times at most the live GradScalers are looked for."""


class ScaleReader:
    """Finds the unscaled loss behind a GradScaler-scaled backward root."""

    def __init__(self) -> None:
        self._scalers: weakref.WeakSet[torch.amp.GradScaler] = weakref.WeakSet()
        self._searches = 0
        self.scale: torch.Tensor | None = None
        """The GradScaler's scale the last root was scaled by (None: it was not)."""

    def unscaled(self, root: torch.Tensor) -> torch.Tensor | None:
        """The loss that `root` is the scaled form of, or None where `root` is no
        GradScaler's scaling."""
        self.scale = None
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
        if not self._known(ptr):
            return None
        self.scale = scale
        return root.detach() / scale

    def _known(self, ptr: int) -> bool:
        for s in self._scalers:
            own = getattr(s, "_scale", None)
            if isinstance(own, torch.Tensor) and own.data_ptr() == ptr:
                return True
        return False


class ScaleTrail:
    """The loss scales of one step's scaled backwards: the first and the last, queued on
    the step's `Scalars` (`heard`), read back into the row (`values`)."""

    def __init__(self) -> None:
        self.new_step()

    def new_step(self) -> None:
        self._first = self._last = -1

    def heard(self, scale: torch.Tensor, sc: reductions.Scalars) -> None:
        """A backward scaled by `scale` (the scaler's own tensor, copied: it is updated in
        place after a skipped step)."""
        pos = sc.add(scale.detach().clone())
        if self._first < 0:
            self._first = pos
        self._last = pos

    def values(self, v: list[float]) -> dict[str, float]:
        """After the transfer `v`: `amp_scale_from` and `amp_scale` (the first and last
        scale of the step's scaled backwards); none without a scaled backward."""
        if self._first < 0:
            return {}
        return {"amp_scale_from": v[self._first], "amp_scale": v[self._last]}
