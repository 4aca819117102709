"""Gradients: vanished, exploded, or not finite (per layer, weight and bias together)."""

from __future__ import annotations

import math

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._scan import ERROR, Finding, fmt, grade


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    g = trace.col("grad_norm", lo, stop).astype(np.float64)
    finite = np.isfinite(g)
    nonfinite = grade(~np.isnan(g), (~finite, ERROR))
    exploding = grade(finite, (g > th.explode, ERROR))
    vanishing = grade(finite, (g < th.vanish, ERROR))
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
