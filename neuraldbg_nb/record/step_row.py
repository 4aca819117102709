"""A step's trace row, assembled on the host from the step's one transfer.

The probe queues each number on the device (`reductions.Scalars`) and remembers where it
will be in the transfer; these functions read them back into per-layer columns and
scalars. They run right after a training step, when the CPU's caches hold the training's
data, not ours: plain loops over a few dozen floats beat numpy there, and the numpy that
stays does each column in a few calls (`benchmarks/RESULTS.md`).
"""

from __future__ import annotations

import math

import numpy as np

Fingerprint = tuple[tuple[float, float, float, float], ...]
"""Each distinct input batch of a step, in order: its min, max, sum and position-weighted
sum (`inputs.input_batch`); equal from one step to the next only for repeated batches."""


def absmax(calls: list[int], mins: list[float], maxs: list[float], n: int,
           masks: set[int] | frozenset[int] = frozenset()) -> np.ndarray:
    """Each layer's abs-max over its calls in the step (`calls`: the layer of each; inf
    where any value was not finite, NaN where it was not called). For a layer of `masks`
    (`masking`), -inf values are its mask, not a fault: its abs-max is that of its max.
    A loop over the calls: right after a training step the caches are cold, and there
    it takes about a quarter of the time of the six numpy calls that do the same
    (`benchmarks/RESULTS.md`)."""
    out = [math.nan] * n
    inf, isnan = math.inf, math.isnan
    for i, lo, hi in zip(calls, mins, maxs):
        if lo == -inf and i in masks and hi != -inf:
            lo = hi
        a = inf if isnan(lo) or isnan(hi) else max(abs(lo), abs(hi))  # NaN: not finite
        if not out[i] >= a:  # the first call (NaN), or a larger one
            out[i] = a
    with np.errstate(over="ignore"):  # beyond float32 (a float64 model's 1e211): inf
        return np.array(out, np.float32)


def masking(calls: list[int], mins: list[float], maxs: list[float], first: int) -> set[int]:
    """Layers from index `first` on (those first called in this step) whose output holds
    -inf where its other values are finite: a mask by design (attention scores, logits
    of illegal actions, set to -inf for a softmax or a sampler to take as zero
    probability). A layer whose output turns -inf later (a log of 0) is still a fault."""
    return {i for i, lo, hi in zip(calls, mins, maxs)
            if i >= first and lo == -math.inf and math.isfinite(hi)}


def rich_columns(rich: list[tuple[int, ...]], values: list[float],
                 n: int) -> dict[str, np.ndarray]:
    """The sampled step's activation statistics per layer, summed over its calls: NaN
    for layers not called."""
    # per entry: layer, numel, then positions of sum, norm, zeros, non-finite, dead,
    # saturated (-1: none), units, counted; read from v in a few array ops
    v = np.array(values)
    e = np.array(rich, np.int64).reshape(-1, 10)
    pos = e[:, 2:8]
    got = np.where(pos >= 0, v[pos], 0.0)  # non-finite -1: known finite on the host
    dead, sat = pos[:, 4] >= 0, pos[:, 5] >= 0
    # numel, sum, sumsq, zeros, counted, non-finite, dead, units, saturated
    vals = np.stack([e[:, 1], got[:, 0], got[:, 1] ** 2, got[:, 2], e[:, 9], got[:, 3],
                     got[:, 4], np.where(dead, e[:, 8], 0), got[:, 5]], axis=1)
    tot = np.zeros((n, 9))
    np.add.at(tot, e[:, 0], vals)
    has_dead = np.zeros(n, bool)
    has_dead[e[dead, 0]] = True
    has_sat = np.zeros(n, bool)
    has_sat[e[sat, 0]] = True
    counts = tot[:, 0]
    seen = counts > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = tot[:, 1] / counts
        std = np.sqrt(np.maximum(tot[:, 2] / counts - mean ** 2, 0.0))
        cols = {
            "act_mean": mean, "act_std": std,
            "zero_frac": tot[:, 3] / tot[:, 4],
            "act_nonfinite": tot[:, 5],
            "dead_frac": np.where(has_dead & (tot[:, 7] > 0), tot[:, 6] / tot[:, 7], np.nan),
            "sat_frac": np.where(has_sat, tot[:, 8] / tot[:, 4], np.nan),
        }
    with np.errstate(over="ignore"):
        return {k: np.where(seen, c, np.nan).astype(np.float32) for k, c in cols.items()}


def loss(v: list[float], heard: list[int], logged: list[int], logged_host: list[float],
         accumulated: bool = False) -> float:
    """The step's loss: the mean of what `run.log_loss` was given where it was called,
    else of the tensors `backward()` was called on (`heard`); inf where not finite.
    `accumulated`: the loop scales each backward's loss by 1 / (backwards per step), as
    Lightning, transformers and accelerate do under gradient accumulation, so the step's
    loss, the one they log, is the sum of the heard ones."""
    values = ([v[p] for p in logged] + logged_host) if (
        logged or logged_host) else [v[p] for p in heard]
    if not values:
        return math.nan
    total = float(sum(values))
    if accumulated and not (logged or logged_host):
        return total if math.isfinite(total) else math.inf
    mean = total / len(values)  # np.mean: 60 us on a cold cache, this 1
    return mean if math.isfinite(mean) else math.inf


def input_scalars(inputs: list[tuple[dict[str, int], int]], v: list[float],
                  last: Fingerprint | None) -> tuple[dict[str, float], Fingerprint | None]:
    """The input batches' summary (`inputs.input_batch`'s positions in `v`, and each
    batch's size), and their fingerprint (of the step's distinct batches): batches whose
    fingerprint is `last`, the previous step's, are an exact repeat."""
    if not inputs:
        return {}, last
    got = [({k: v[p] if p >= 0 else numel for k, p in pos.items()}, numel)
           for pos, numel in inputs]  # p < 0: all finite, known on the host
    numel = float(sum(n for _, n in got))
    mins = [g["min"] for g, _ in got]
    maxs = [g["max"] for g, _ in got]
    absmax = max(abs(a) for a in mins + maxs)
    flagged = not math.isfinite(absmax)
    rich = all("finite" in g for g, _ in got)
    # exact count on sampled steps; elsewhere "some" (inf) when min or max says so
    nonfinite = numel - sum(g["finite"] for g, _ in got) if rich else (
        math.inf if flagged else 0.0)
    mean = sum(g["sum"] for g, _ in got) / numel
    out = {"in_absmax": math.inf if flagged else absmax, "in_mean": mean,
           "in_nonfinite": nonfinite,
           "in_const": float(all(a == b for a, b in zip(mins, maxs)) and not flagged)}
    if rich:
        sq = sum(g["norm"] ** 2 for g, _ in got)
        out["in_std"] = math.sqrt(max(sq / numel - mean ** 2, 0.0)) if not flagged else math.nan
        out["in_zero_frac"] = 1.0 - sum(g["nonzero"] for g, _ in got) / numel
    # the step's distinct batches, in order: a closure that runs the forward on the same
    # batch a varying number of times a step (L-BFGS: 17 to 25) feeds one batch
    fingerprint = tuple(dict.fromkeys((g["min"], g["max"], g["sum"], g["print"])
                                      for g, _ in got))
    out["in_repeat"] = float(fingerprint == last and not flagged)
    return out, fingerprint


def layer_fractions(v: list[float], pos: list[int], layers: list[int], sizes: list[int],
                    n: int) -> np.ndarray:
    """Per layer, the counts at `pos` in `v` summed over its tensors, over the elements
    they are of; NaN for layers with none."""
    counts = np.bincount(layers, [v[p] for p in pos], minlength=n)
    total = np.bincount(layers, np.array(sizes, np.float64), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (counts / total).astype(np.float32)


def layer_norms(v: list[float], parts: list[tuple[list[int], list[int]]],
                n: int) -> np.ndarray:
    """Per-layer norms (sqrt of summed squares of per-tensor norms) for each of `parts`,
    (positions in `v`, layer indices), as the rows of one (len(parts), n) array: NaN for
    layers with no tensor, inf where any tensor's norm is not finite. A loop over floats
    and one array at the end: after a training step the caches are cold, and there the
    nine numpy calls that do the same cost more than the loop."""
    rows = []
    for pos, idx in parts:
        total = [0.0] * n
        seen = [False] * n
        for p, i in zip(pos, idx):
            x = v[p]
            total[i] += x * x  # NaN stays NaN; beyond float64, inf
            seen[i] = True
        rows.append([(math.inf if math.isnan(t) else math.sqrt(t)) if s else math.nan
                     for t, s in zip(total, seen)])
    with np.errstate(over="ignore"):  # beyond float32 (a float64 model's 1e211): inf
        return np.array(rows, np.float32).reshape(len(parts), n)
