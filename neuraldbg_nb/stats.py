"""Device-side summaries: cheap reductions that stay on the tensor's device.

Every function here returns 0-d tensors and never calls `.item()`: a step's summaries are
collected in a `Scalars` batch and reach the host in one transfer per device. The cheap
path (every step) is one `aminmax` per activation, which also flags non-finite values for
free (a NaN or Inf anywhere makes min or max non-finite). The rich path (sampled steps)
adds sums, zero and non-finite counts, dead units and saturation.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch


class Scalars:
    """0-d device tensors gathered during a step, moved to the host together."""

    def __init__(self) -> None:
        self._items: list[torch.Tensor] = []

    def add(self, t: torch.Tensor) -> int:
        self._items.append(t if t.dim() == 0 else t.reshape(()))
        return len(self._items) - 1

    def __len__(self) -> int:
        return len(self._items)

    def to_host(self) -> np.ndarray:
        """All values as float64, in the order added; one device-to-host copy per device."""
        out = np.empty(len(self._items), np.float64)
        if not self._items:
            return out
        by_device: dict[torch.device, dict[torch.dtype, list[int]]] = defaultdict(
            lambda: defaultdict(list))
        for i, t in enumerate(self._items):
            by_device[t.device][t.dtype].append(i)
        for device, by_dtype in by_device.items():
            wide = torch.float32 if device.type == "mps" else torch.float64
            order: list[int] = []
            parts = []
            for idx in by_dtype.values():
                parts.append(torch.stack([self._items[i] for i in idx]).to(wide))
                order.extend(idx)
            out[order] = torch.cat(parts).cpu().numpy()
        self._items.clear()
        return out


def min_max(x: torch.Tensor, into: Scalars) -> tuple[int, int]:
    mn, mx = torch.aminmax(x)
    return into.add(mn), into.add(mx)


def rich_activation(x: torch.Tensor, role: str, bounds: tuple[float, float] | None,
                    into: Scalars) -> tuple[int, int, int, int, int, int, int]:
    """Positions of (sum, norm, nonzero count, finite count, dead units, saturated count),
    -1 where not applicable, and the number of units (known on the host)."""
    f32 = torch.float32
    p_sum = into.add(x.sum(dtype=f32))
    p_norm = into.add(torch.linalg.vector_norm(x, dtype=f32))
    p_nz = into.add(torch.count_nonzero(x))
    p_fin = into.add(torch.isfinite(x).sum())
    p_dead = p_sat = -1
    units = 0
    if role == "relu" and x.dim() >= 2:
        # units: features of (N, F) and (N, T, F), channels of (N, C, ...)
        unit_dim = x.dim() - 1 if x.dim() in (2, 3) else 1
        dims = [d for d in range(x.dim()) if d != unit_dim]
        p_dead = into.add((x.amax(dim=dims) <= 0).sum())
        units = x.shape[unit_dim]
    if bounds is not None:
        lo, hi = bounds
        center, half = (lo + hi) / 2, (hi - lo) / 2
        p_sat = into.add(((x - center).abs() >= 0.98 * half).sum())
    return p_sum, p_norm, p_nz, p_fin, p_dead, p_sat, units


def input_batch(x: torch.Tensor, rich: bool, into: Scalars) -> dict[str, int]:
    """Positions of a batch's summaries. Every step: min, max (a free non-finite flag),
    sum and a strided sum (with min and max, a fingerprint that tells an exact repeat of
    the previous batch). Sampled steps add the norm, nonzero and finite counts."""
    xf = x if x.is_floating_point() else x.float()
    mn, mx = torch.aminmax(xf)
    pos = {"min": into.add(mn), "max": into.add(mx),
           "sum": into.add(xf.sum(dtype=torch.float32)),
           "print": into.add(xf.reshape(-1)[1::3].sum(dtype=torch.float32))}
    if rich:
        pos["norm"] = into.add(torch.linalg.vector_norm(xf, dtype=torch.float32))
        pos["nonzero"] = into.add(torch.count_nonzero(xf))
        pos["finite"] = into.add(torch.isfinite(xf).sum())
    return pos


def grouped_norms(tensors: list[torch.Tensor], into: Scalars) -> list[int]:
    """Norm of each tensor, fused per (device, dtype) with `torch._foreach_norm`."""
    groups: dict[tuple[torch.device, torch.dtype, bool], list[int]] = defaultdict(list)
    for i, t in enumerate(tensors):
        groups[(t.device, t.dtype, t.is_sparse)].append(i)
    pos = [0] * len(tensors)
    for idx in groups.values():
        dense = [tensors[i] for i in idx]
        if dense[0].is_sparse:
            norms = [torch.linalg.vector_norm(t.coalesce().values()) for t in dense]
        else:  # half-precision norms overflow at 65504: accumulate in float32
            wide = torch.float32 if dense[0].element_size() < 4 else None
            norms = list(torch._foreach_norm(dense, 2, dtype=wide))
        for i, n in zip(idx, norms):
            pos[i] = into.add(n)
    return pos
