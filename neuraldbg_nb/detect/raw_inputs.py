"""Raw, unnormalised inputs: pixel values 0-255, features of order 1000, fed to the model
as they are.

Judged at the run's first step, from what every step records: the input batch's
abs-max and mean (`in_absmax`, `in_mean`), and the first layer's output abs-max where that
step measured it. A batch of 100 or more whose first layer (in forward order) answers at
100 or more is raw data the model feels: a Conv2d on 0-255 pixels outputs about 370
where the same pixels divided by 255 give 1.2, and the first update then explodes. A
model that normalises inside (a BatchNorm first, token ids into an Embedding) has a
first layer of ordinary scale, and says nothing. The condition stays open while the
inputs stay at that scale, so that the failure it causes later is blamed on it
(`rootcause`).
"""

from __future__ import annotations

import numpy as np

from ..trace.columns import Trace
from .scan import HOLD, OK, WARNING, Finding, fmt
from .thresholds import Thresholds


def _advice(absmax: float, mean: float) -> str:
    """What to do for a batch of this scale: divide by 255 for pixel values (a batch in
    [0, 255]), standardise otherwise."""
    if 100 <= absmax <= 255 and mean >= 0:
        return ("divide the pixels by 255 (transforms.ToTensor() does) and standardise "
                "them with the data set's mean and std (transforms.Normalize)")
    return ("standardise each feature with the training set's mean and std "
            "((x - mean) / std, sklearn's StandardScaler)")


def finding(trace: Trace, lo: int, stop: int, th: Thresholds) -> Finding:
    absmax = trace.scalar("in_absmax", lo, stop)
    mean = trace.scalar("in_mean", lo, stop)
    first = trace.col("act_absmax", lo, stop)[:, 0] if trace.n_layers else \
        np.full(stop - lo, np.nan)
    codes = np.full(stop - lo, HOLD, np.int8)
    with np.errstate(invalid="ignore"):
        codes[np.isfinite(absmax) & (absmax < th.raw_input)] = OK  # normalised (again)
        if lo == 0 and stop > 0 and np.isfinite(absmax[0]) and absmax[0] >= th.raw_input:
            # the verdict of the first step: felt by the first layer, or not measured
            codes[0] = WARNING if first[0] >= th.raw_input else \
                (HOLD if np.isnan(first[0]) else OK)

    def message(n: str, s: int, v: float, p: float, sev: str) -> str:
        out = float(first[s - lo]) if lo <= s < stop else float("nan")
        return (f"input batch at step {s} is raw, not normalised: abs-max {fmt(v)}, mean "
                f"{fmt(p)}, and the first layer's output reaches {fmt(out)} (about 1 for "
                f"normalised inputs): {_advice(v, p)}")

    return Finding("data_anomaly", "input_raw", codes[:, None], absmax[:, None],
                   previous=mean[:, None], per_layer=False, message=message,
                   recovery=lambda n, s, v, p, sev: f"input batch normalised at step {s} "
                                                    f"(abs-max {fmt(v)})")
