"""The input batch's summary, and its fingerprint: is this batch the last one again?

Every step: min, max (a free non-finite flag), sum and a position-weighted sum; sampled
steps add the norm and the nonzero and finite counts. The probe queues them on the step's
`reductions.Scalars`; `step_row.input_scalars` reads them back into the row.
"""

from __future__ import annotations

import torch

from . import reductions


def _scattered(n: int) -> torch.Tensor:
    """n weights in [0, 1) without pattern, in float64: frac(sin(i) x 43758.5453), a hash
    used for noise in shaders. Without random numbers (the user's generator is never
    touched). Weights with a pattern let batches cancel out: with frac(i x golden ratio)
    the difference of two one-hot rows depends on their states only, not on the row, and
    batches of one-hot states collided as with weights 0, 1, 2, ..."""
    return torch.frac(torch.sin(torch.arange(1, n + 1, dtype=torch.float64)) * 43758.5453).abs()


class Ramps:
    """The weights of the input fingerprint's weighted sum (`input_batch`, `_scattered`), one
    vector per batch size (up to `RAMP_MAX`), dtype and device, the last two kept (a data
    set's last batch is smaller). A weighted sum tells apart batches that a sum does not:
    two one-hot vectors always have the same min, max and sum. Weights in a pattern do not
    either: a strided sum (every third element) missed hot positions that differ by a
    multiple of 3, and weights 0, 1, 2, ... (until session 18) any two batches whose hot
    positions add up alike (a batch of 16 one-hot states out of 6 "repeated" the one
    before 7 times in 300 steps)."""

    KEEP = 2

    def __init__(self) -> None:
        self._kept: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}

    def like(self, flat: torch.Tensor) -> torch.Tensor:
        key = (flat.numel(), flat.dtype, flat.device)
        ramp = self._kept.get(key)
        if ramp is None:
            if len(self._kept) >= self.KEEP:
                self._kept.pop(next(iter(self._kept)))
            ramp = self._kept[key] = _scattered(key[0]).to(device=key[2], dtype=key[1])
        return ramp

    def release(self) -> None:
        self._kept.clear()


def input_batch(x: torch.Tensor, rich: bool, into: reductions.Scalars, ramps: Ramps) -> dict[str, int]:
    """Positions of a batch's summaries. Every step: min, max (a free non-finite flag),
    sum and a position-weighted sum (`Ramps`; with min and max, a fingerprint that tells
    an exact repeat of the previous batch). Sampled steps add the norm, nonzero and finite
    counts; the finite count is -1 (all of them) where a CPU batch's min and max are
    finite. A channels-last batch is read in its memory order (`reductions.dense`); one with
    gaps is copied once; a sparse one through its stored values; a half-precision one is
    weighed in float32 (its ramp would round above 256)."""
    if x.layout != torch.strided:
        x = reductions.stored_values(x)
    xf = x if x.is_floating_point() else x.float()
    flat = reductions.dense(xf)
    flat = (xf.contiguous() if flat is None else flat).view(-1)
    mn, mx = reductions.min_max(flat)
    pos = {"min": into.add(mn), "max": into.add(mx),
           "sum": into.add(flat.sum(dtype=reductions.acc_dtype(flat))),
           "print": into.add(_weighed(flat, ramps))}
    if rich:
        pos["norm"] = into.add(torch.linalg.vector_norm(flat, dtype=reductions.acc_dtype(flat)))
        pos["nonzero"] = into.add(torch.count_nonzero(flat))
        pos["finite"] = -1 if reductions.known_finite(mn, mx) else into.add(torch.isfinite(flat).sum())
    return pos


RAMP_MAX = 1 << 20
"""The longest weight vector of `Ramps` (4 MB in float32): a larger batch (an image batch
of 38 MB on an accelerator) is weighed by position modulo this, a dot product per slice,
instead of holding a ramp as large as the batch."""


def _weighed(flat: torch.Tensor, ramps: Ramps) -> torch.Tensor:
    """sum(w[i mod `RAMP_MAX`] * flat[i]) with the weights of `Ramps`: one pass, in dot
    products."""
    wide = flat if flat.element_size() >= 4 else flat.float()
    ramp = ramps.like(wide[:RAMP_MAX])
    n = wide.numel()
    if n <= RAMP_MAX:
        return torch.dot(wide, ramp)
    return torch.stack([torch.dot(wide[i:i + RAMP_MAX], ramp[:min(RAMP_MAX, n - i)])
                        for i in range(0, n, RAMP_MAX)]).sum()
