"""Gradients that grow by a steady factor per layer toward the input from the first step:
the mark of an initialisation whose layers amplify the backward signal.

Read from the run's first step (`Trace.first_grad_norm`, kept when the steps around it
are compacted), over the layers with parameters in forward order, the output layer left
out (its gradient is the loss's own scale). A deep tanh network initialised with weights
of std 4/sqrt(fan_in) has gradient norms 741, 725, 447, ..., 0.38, 0.23 from its first
layer to its last hidden one: 1.5x per layer toward the input, 3000x over 19 layers,
while the same network at std 1/sqrt(fan_in) reads about 0.1 throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..trace.columns import Trace

MIN_LAYERS = 4
"""Hidden layers with a gradient at the first step needed to speak of a per-layer factor."""
FACTOR = 1.3
"""Per-layer growth toward the input from which it is named."""
SPAN = 10.0
"""Growth over all the layers from which it is named: a few layers at 1.3x are not it."""
STEADY = 0.8
"""Fraction of neighbouring layers whose gradient grows toward the input."""


@dataclass(frozen=True)
class Growth:
    """How the first step's gradients grow toward the input."""

    factor: float
    """Per layer, the least-squares fit of log10 of the norms against the layer's place."""
    first: str
    """The first layer in forward order (the largest gradient)."""
    first_norm: float
    last: str
    """The last hidden layer (the smallest)."""
    last_norm: float


def growth(trace: Trace) -> Growth | None:
    """The steady growth of the first step's gradients toward the input, or None where
    they do not grow so (`FACTOR`, `SPAN`, `STEADY`)."""
    g = np.asarray(trace.first_grad_norm[: trace.n_layers], np.float64)
    idx = [i for i, info in enumerate(trace.layers)
           if info.has_params and math.isfinite(g[i]) and g[i] > 0][:-1]  # the head left out
    if len(idx) < MIN_LAYERS:
        return None
    logs = np.log10(g[idx])
    slope = np.polyfit(np.arange(len(idx)), logs, 1)[0]
    factor = 10.0 ** -slope
    steady = float(np.mean(np.diff(logs) < 0))
    if factor < FACTOR or 10.0 ** (logs.max() - logs.min()) < SPAN or steady < STEADY:
        return None
    return Growth(float(factor), trace.layers[idx[0]].label, float(g[idx[0]]),
                  trace.layers[idx[-1]].label, float(g[idx[-1]]))
