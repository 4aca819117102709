"""Activations: non-finite outputs, dead ReLU units, saturated bounded activations.

Type-aware: dead units are only judged after ReLU-like layers and saturation only after
bounded activations (sigmoid, tanh, ...), where those words mean something.
"""

from __future__ import annotations

import math

import numpy as np

from ..trace.columns import Trace
from .scan import ERROR, WARNING, Finding, fmt, grade
from .thresholds import Thresholds

DEAD_ERROR = 0.9
"""Fraction of dead units that is an error rather than a warning (or `dead`, if higher)."""

RECOVER = 0.8
"""A dead or saturated fraction must fall below this share of its threshold to count as
healthy again; between the two the last state holds. Fractions of real layers wander by a
few percent from batch to batch, and without this band a layer near the line would warn
and "recover" every few samples."""


def findings(trace: Trace, lo: int, stop: int, th: Thresholds) -> list[Finding]:
    a = trace.col("act_absmax", lo, stop)
    roles = trace.roles
    nonfinite = grade(~np.isnan(a), (np.isinf(a), ERROR))

    # a layer whose output is not finite is neither alive nor out of saturation: its
    # fractions are not read there, so no recovery contradicts its non-finite event
    finite = ~np.isinf(a) & ~(trace.col("act_nonfinite", lo, stop) > 0)
    dead = trace.col("dead_frac", lo, stop).astype(np.float64)
    relu = (roles == "relu")[None, :]
    dead_codes = grade(relu & finite & ~np.isnan(dead) & ~_band(dead, th.dead),
                       (dead >= th.dead, WARNING), (dead >= max(th.dead, DEAD_ERROR), ERROR))

    sat = trace.col("sat_frac", lo, stop).astype(np.float64)
    bounded = (roles == "bounded")[None, :]
    sat_codes = grade(bounded & finite & ~np.isnan(sat) & ~_band(sat, th.saturated),
                      (sat >= th.saturated, WARNING))
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


def _band(x: np.ndarray, line: float) -> np.ndarray:
    """Where `x` is just below `line`: neither a new condition nor a recovery (HOLD)."""
    with np.errstate(invalid="ignore"):
        return (x >= RECOVER * line) & (x < line)
