"""Hand-made traces for the detector tests: `build` a trace from arrays, `noisy` levels as
real traces have, `rich_trace` with an event of every kind, and `live_scan`, which fills a
trace the way the probe does and advances a `Detection` in chunks (a live run's detection,
to compare with a one-go `detect`). `of` filters events; `key` and `same` make them
comparable data."""

from __future__ import annotations

import math

import numpy as np

import neuraldbg_nb as ndbg
from neuraldbg_nb.detect import Detection
from neuraldbg_nb.trace import Trace

N = 60


def build(layers: list[tuple], cols: dict[str, np.ndarray],
          scalars: dict[str, np.ndarray] | None = None, n: int = N) -> Trace:
    """A trace of n steps; cols are (n, layers) arrays, scalars (n,) arrays. Layers are
    (name, role), or (name, role, has_params) for one without parameters of its own, or
    (name, role, has_params, params) with the number of its own parameters."""
    t = Trace()
    for name, role, *owned in layers:
        t.add_layer(name, "Linear", role, owned[0] if owned else True,
                    params=owned[1] if owned[1:] else -1)
    for s in range(n):
        t.append({c: np.asarray(v[s], np.float32) for c, v in cols.items()},
                 {c: float(v[s]) for c, v in (scalars or {}).items()})
    return t


def noisy(level: float, n: int = N, cols: int = 1, sigma: float = 0.05, seed: int = 0):
    """A level with a little multiplicative noise (log-normal), as real traces have."""
    rng = np.random.default_rng(seed)
    return level * np.exp(sigma * rng.standard_normal((n, cols)))


def of(events, kind=None, layer="any", signal=None):
    return [e for e in events if (kind is None or e.kind == kind)
            and (layer == "any" or e.layer == layer)
            and (signal is None or e.signal == signal)]


def key(e) -> tuple:
    """An event as comparable data, bit for bit (NaN == NaN)."""
    f = lambda x: "nan" if isinstance(x, float) and math.isnan(x) else x
    return tuple(f(v) for v in e.to_dict().values())


def same(e) -> tuple:
    """An event as comparable data, its numbers to 12 significant digits: the same event
    (step, layer, kind, severity, message, signal, end, order), whatever the last bits of
    floating-point summation order."""
    f = lambda x: float(f"{x:.12g}") if isinstance(x, float) and not math.isnan(x) else (
        "nan" if isinstance(x, float) else x)
    return tuple(f(v) for v in e.to_dict().values())


def rich_trace() -> tuple[list[tuple[str, str]], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Several events of several kinds in one trace."""
    n, L = 120, 4
    layers = [("in", "other"), ("relu", "relu"), ("tanh", "bounded"), ("out", "other")]
    rng = np.random.default_rng(11)
    jitter = lambda lvl: lvl * np.exp(0.1 * rng.standard_normal((n, L)))
    g = jitter(0.1)
    g[25:29, 2] = 1e-8                              # vanishing at step 25
    g[50, 3] = 5e4                                  # exploding at 50
    g[100:, 0] = np.inf                             # non-finite gradient at 100
    a = jitter(2.0)
    a[70:, 1] *= 300                                # activation jump at 70
    a[100:, 0] = np.inf                             # non-finite activation at 100
    pn = jitter(5.0) * 0 + 5.0 + np.cumsum(np.full((n, L), 0.001), 0)
    pn[60:, 3] *= 3.0                               # weights tripled in the update of 60
    upd = np.full((n, L), np.nan)
    upd[::10] = 1e-3
    upd[60::10, 0] = 0.0                            # layer 0 left out of the optimizer
    pn[59:, 0] = pn[59, 0]                          # from step 60
    dead = np.full((n, L), np.nan)
    dead[::5, 1] = 0.1
    dead[80::5, 1] = 0.7                            # dead units from 80
    sat = np.full((n, L), np.nan)
    sat[::5, 2] = 0.05
    sat[40:45, 2] = 0.9                             # saturation 40..44
    loss = 1.0 * np.exp(0.05 * rng.standard_normal(n))
    loss[90:93] = 50.0                              # divergence at 90
    lr = np.full(n, 0.1)
    lr[85:] = 10.0                                  # learning rate raised at 85
    in_absmax = 3.0 * np.exp(0.05 * rng.standard_normal(n))
    in_absmax[33] = 3e4                             # a shifted batch at 33
    in_nonfinite = np.zeros(n)
    in_nonfinite[110] = 4.0                         # a batch with NaNs at 110
    eval_layers = np.zeros(n)
    eval_layers[15:22] = 2.0                        # trained in eval mode 15..21
    eval_layers[18] = np.nan                        # (a step without a backward)
    grad_carried = np.zeros(n)
    grad_carried[113:116] = 1.0                     # gradients not zeroed 113..115
    grads_missing = np.zeros(n)
    grads_missing[117:] = 1.0                       # none at the step from 117
    cols = {"grad_norm": g, "act_absmax": a, "param_norm": pn, "update_ratio": upd,
            "dead_frac": dead, "sat_frac": sat}
    scalars = {"loss": loss, "lr": lr, "in_absmax": in_absmax, "in_nonfinite": in_nonfinite,
               "in_const": np.zeros(n), "in_repeat": np.zeros(n), "eval_layers": eval_layers,
               "grad_carried": grad_carried, "grads_missing": grads_missing}
    return layers, cols, scalars


def live_scan(layers, cols, scalars, chunk: int = 1, th=None, since=None):
    """Rebuild the trace the way the probe does (a step's weight norm and update size are
    filled in one step late) and advance a Detection every `chunk` steps. `since`: {layer
    index: the step its module was replaced at}, told to the trace as that step begins."""
    late = ("param_norm", "update_ratio")
    n = len(scalars["loss"])
    t = Trace()
    for name, role, *owned in layers:
        t.add_layer(name, "Linear", role, owned[0] if owned else True,
                    params=owned[1] if owned[1:] else -1)
    det = Detection(th or ndbg.Thresholds())
    streamed = []
    for s in range(n):
        for j, at in (since or {}).items():
            if at == s:
                t.update_layer(j, since=at)
        if s > 0:
            for c in late:
                t.set_layer_values(c, s - 1, cols[c][s - 1].astype(np.float32))
        t.append({c: v[s].astype(np.float32) for c, v in cols.items() if c not in late},
                 {c: float(v[s]) for c, v in scalars.items()})
        if (s + 1) % chunk == 0 or s == n - 1:
            streamed += det.advance(t)
    for c in late:  # the probe's flush at exit
        t.set_layer_values(c, n - 1, cols[c][n - 1].astype(np.float32))
    return t, det, streamed
