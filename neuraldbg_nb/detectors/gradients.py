"""Gradients: vanished, exploded, or not finite (per layer, weight and bias together)."""

from __future__ import annotations

import math

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._scan import ERROR, Finding, fmt, grade

RECOVER = 10.0
"""A vanished gradient norm must climb above `RECOVER` x `vanish` to count as healthy
again; between the two the last state holds. A layer's gradient norm moves by up to a
decade from batch to batch, and a dying layer whose norm settled at the line (0.7-1.6e-6
against `vanish` 1e-6, with the batch, in the benchmark MLP after 1,200 steps) was
reported vanishing and "back to healthy" again at every pass over its 16 batches.
Exploding gradients have no such band: they are reported at once, and a model whose
healthy norms are in the hundreds would stay "exploding" long after a spike."""


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    g = trace.col("grad_norm", lo, stop).astype(np.float64)
    finite = np.isfinite(g)
    nonfinite = grade(~np.isnan(g), (~finite, ERROR))
    exploding = grade(finite, (g > th.explode, ERROR))
    vanishing = grade(finite & ~((g >= th.vanish) & (g < th.vanish * RECOVER)),
                      (g < th.vanish, ERROR))
    return [
        Finding("nonfinite_gradient", "gradient", nonfinite, g, sticky=True, message=lambda
                n, s, v, p, sev: f"{n}: gradient became non-finite at step {s} "
                                 f"(norm was {fmt(p)})"),
        Finding("exploding_gradient", "gradient", exploding, g, message=lambda
                n, s, v, p, sev: f"{n}: gradient norm healthy ({fmt(p)}) -> exploding "
                                 f"({fmt(v)}) at step {s}"
                if not math.isnan(p) else f"{n}: gradient norm exploding ({fmt(v)}) from step {s}",
                recovery=lambda n, s, v, p, sev: f"{n}: gradient norm back to healthy "
                                                 f"({fmt(v)}) at step {s}"),
        Finding("vanishing_gradient", "gradient", vanishing, g, patience=th.patience,
                message=lambda n, s, v, p, sev: f"{n}: gradient norm healthy ({fmt(p)}) -> "
                                                f"vanishing ({fmt(v)}) at step {s}"
                if not math.isnan(p) else f"{n}: gradient norm vanishing ({fmt(v)}) from step {s}",
                recovery=lambda n, s, v, p, sev: f"{n}: gradient norm back to healthy "
                                                 f"({fmt(v)}) at step {s}"),
    ]
