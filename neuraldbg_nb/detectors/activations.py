"""Activations: non-finite outputs, dead ReLU units, saturated bounded activations.

Type-aware: dead units are only judged after ReLU-like layers and saturation only after
bounded activations (sigmoid, tanh, ...), where those words mean something.
"""

from __future__ import annotations

import math

import numpy as np

from ..thresholds import Thresholds
from ..trace import Trace
from ._scan import ERROR, HOLD, OK, WARNING, Finding, fmt

DEAD_ERROR = 0.9
"""Fraction of dead units that is an error rather than a warning (or `dead`, if higher)."""


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    a = trace.col("act_absmax", lo, stop).astype(np.float64)
    roles = trace.roles
    nonfinite = np.where(np.isnan(a), HOLD, np.where(np.isfinite(a), OK, ERROR)).astype(np.int8)

    dead = trace.col("dead_frac", lo, stop).astype(np.float64)
    relu = (roles == "relu")[None, :]
    dead_codes = np.where(~relu | np.isnan(dead), HOLD,
                          np.where(dead >= max(th.dead, DEAD_ERROR), ERROR,
                                   np.where(dead >= th.dead, WARNING, OK))).astype(np.int8)

    sat = trace.col("sat_frac", lo, stop).astype(np.float64)
    bounded = (roles == "bounded")[None, :]
    sat_codes = np.where(~bounded | np.isnan(sat), HOLD,
                         np.where(sat >= th.saturated, WARNING, OK)).astype(np.int8)
    return [
        Finding("nonfinite_activation", "activation", nonfinite, a, sticky=True,
                message=lambda n, s, v, p, sev: f"{n}: activations became non-finite at step "
                                                f"{s} (abs-max was {fmt(p)})"),
        Finding("dead_units", "activation", dead_codes, dead, patience=th.patience,
                message=lambda n, s, v, p, sev: f"{n}: {v:.0%} of units dead (zero for the "
                                                f"whole batch) from step {s}"
                                                + (f", was {p:.0%}" if not math.isnan(p) else ""),
                recovery=lambda n, s, v, p, sev: f"{n}: units alive again ({v:.0%} dead) at "
                                                 f"step {s}"),
        Finding("saturation", "activation", sat_codes, sat, patience=th.patience,
                message=lambda n, s, v, p, sev: f"{n}: {v:.0%} of outputs saturated at the "
                                                f"bounds from step {s}"
                                                + (f", was {p:.0%}" if not math.isnan(p) else ""),
                recovery=lambda n, s, v, p, sev: f"{n}: out of saturation ({v:.0%}) at step "
                                                 f"{s}"),
    ]
