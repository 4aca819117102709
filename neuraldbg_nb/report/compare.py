"""Two runs side by side: where they part, and the events one has and the other lacks.

The use: "this broke after my change; where does it start to differ from yesterday's run".
Two runs *part* at the first step where a key number of a layer they share (its weights'
norm, its activations' abs-max, its gradient norm) or the loss differs beyond noise, and
keeps differing: the difference (in decades) exceeds `NOISE_FACTOR` times the noise,
measured from the runs themselves as the robust scale of each series' step-to-step
changes, and never less than `MIN_DECADES`, at that step and over most of the next
`PERSIST` steps. Where no number parts, a layer in error in one run and not in the other
parts them. Runs of the same recipe with other seeds differ within that noise and do not
part; a fault parts them at its step.

At the parting step, the layer named is where the difference starts: the first layer in
forward order whose activations part (the layers before it computed the same), else the last
one whose gradient parts (the backward starts at the output), else the first whose weights
part after the step's update (a learning rate, an optimizer), else the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..detect.states import LEVEL

if TYPE_CHECKING:
    from ..detect.events import Event
    from .run import Run

NOISE_FACTOR = 8.0
"""A difference this many times the runs' own step-to-step noise parts them."""
MIN_DECADES = 0.5
"""...and never one under half a decade (a factor of about 3): runs of other seeds differ
by less, a fault by more."""
PERSIST = 5
"""Measured steps from the parting step over which the difference must hold at most of them
(a single noisy step does not part two runs)."""
QUANTITIES = (("act_absmax", True), ("grad_norm", False), ("param_norm", True))
"""The key numbers of a layer, in the order a step computes them (the forward, the backward,
the update: `param_norm` is the weights' norm after the step's update), each with whether
its difference starts at the first layer of the forward order that parts (True) or at the
last (False: the backward runs from the output back)."""
SOME_STEPS = frozenset({"act_absmax"})
"""The quantities measured at some steps only (the steps whose layer hooks were on), where
a step one run measured and the other did not is compared with the other's last measured
value (`_one_sided`); elsewhere NaN is no evidence."""
LOSS_DECADES = 1.0
"""The loss parts two runs beyond a factor of 10 only: a small loss late in training differs
between seeds by more than the layers' numbers do."""
WINDOW_MIN = 3
"""Measured steps a parting must hold over (of its `PERSIST`) unless one run's number is
non-finite and the other's not, which parts them at once."""
TINY = 1e-30
"""Where a number is 0: its log, so that 0 against non-zero is a large difference."""
LABELS = {"param_norm": "weight norm", "act_absmax": "activation abs-max",
          "grad_norm": "gradient norm", "loss": "loss", "health": "health"}


@dataclass(frozen=True)
class Parting:
    """Where two runs part: the step, the layer (None: the loss), which number, and its
    value in each run."""

    step: int
    layer: str | None
    quantity: str
    a: float
    b: float
    threshold: float
    """The difference that parts them here, in decades (in the loss's own unit where the
    loss is not positive); 0 for a parting of health."""

    def __str__(self) -> str:
        where = f"layer {self.layer}" if self.layer is not None else "the loss"
        if self.quantity == "health":
            return (f"they part at step {self.step}, {where}: in error in "
                    f"{'the first' if self.a else 'the second'} run only")
        unit = "decade" if self.threshold == 1 else "decades"
        return (f"they part at step {self.step}, {where}: {LABELS[self.quantity]} "
                f"{self.a:.4g} vs {self.b:.4g} (beyond their noise: "
                f"{self.threshold:.2g} {unit})")


@dataclass(frozen=True)
class Comparison:
    """What `compare(a, b)` finds (printed as sentences)."""

    a_name: str
    b_name: str
    steps: int
    """Steps compared: those both runs recorded."""
    layers: list[str]
    """Layers both runs have, by name, in the first run's order."""
    parting: Parting | None
    """Where they part; None where they stay within their noise."""
    only_a: list[Event] = field(default_factory=list)
    """The first event of each (kind, layer) of warnings and errors that only `a` has."""
    only_b: list[Event] = field(default_factory=list)

    @property
    def part(self) -> bool:
        return self.parting is not None

    def __str__(self) -> str:
        head = f"neuraldbg compare {self.a_name} vs {self.b_name} ({self.steps} common steps, " \
               f"{len(self.layers)} common layers): "
        lines = [head + (str(self.parting) if self.parting is not None
                         else "they do not part (every key number stays within their noise)")]
        for name, only in ((self.a_name, self.only_a), (self.b_name, self.only_b)):
            if only:
                lines.append(f"  only in {name}:")
                lines += [f"    {e}" + (f" ({e.layer})" if e.layer else "") for e in only]
        return "\n".join(lines)


def _as_run(x: Run | str | Path) -> tuple[Run, str]:
    from .run import Run, load

    if isinstance(x, Run):
        return x, str(x.loaded_from.name) if x.loaded_from is not None else "run"
    path = Path(x)
    return load(path), path.name


def _log(v: np.ndarray) -> np.ndarray:
    """Decades of `v`: 0 as `TINY`, an infinite value as +inf, NaN (not measured) kept."""
    out = np.where(np.isnan(v), np.nan, np.inf)
    finite = np.isfinite(v)
    out[finite] = np.log10(np.maximum(np.abs(v[finite]), TINY))
    return out


def _one_sided(va: np.ndarray, vb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`va` and `vb` where a step was measured in one run only (activations, measured at
    some steps: a fault's step is replayed in the broken run alone), the other run's last
    measured value of that column standing for its own at that step: the level the layer
    held there, without which the fault's own step would be no evidence."""
    one = np.isnan(va) != np.isnan(vb)
    if not one.any():
        return va, vb
    return np.where(one, _carried(va), va), np.where(one, _carried(vb), vb)


def _carried(v: np.ndarray) -> np.ndarray:
    """Each column's last measured (not NaN) value at every step, NaN before the first."""
    rows = np.where(np.isnan(v), -1, np.arange(len(v))[:, None])
    np.maximum.accumulate(rows, axis=0, out=rows)
    out = np.take_along_axis(v, np.maximum(rows, 0), axis=0)
    out[rows < 0] = np.nan
    return out


def _noise(x: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Robust scale of the changes of each column of `x` from one measured value to the
    next, over the steps both runs measured (`measured`; a column measured on some steps
    only, as activations are, is read over those), finite ones only."""
    out = np.zeros(x.shape[1:])
    for j in range(x.shape[1]):
        col = x[measured[:, j], j]
        with np.errstate(invalid="ignore"):  # inf - inf: not a change that is measured
            d = np.abs(np.diff(col))
        d = d[np.isfinite(d)]
        if len(d):
            out[j] = 1.4826 * float(np.median(d))
    return out


def _parted(xa: np.ndarray, xb: np.ndarray, floor: float,
            both: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(steps x columns) whether the series part there and keep parted, and the threshold
    of each column. `both`: where both runs measured the values themselves (the noise is
    read there), where `xa` and `xb` carry one run's value over a step it did not measure
    (`_one_sided`); None: wherever neither is NaN."""
    nan = np.isnan(xa) | np.isnan(xb)  # not measured in one of them: no evidence
    measured = ~nan if both is None else both
    threshold = np.maximum(NOISE_FACTOR * np.maximum(_noise(xa, measured),
                                                     _noise(xb, measured)), floor)
    both_inf = np.isinf(xa) & np.isinf(xb) & (np.sign(xa) == np.sign(xb))
    with np.errstate(invalid="ignore"):
        diff = np.where(both_inf, 0.0, np.abs(xa - xb))
    over = (diff > threshold) & ~nan
    decisive = (np.isposinf(xa) != np.isposinf(xb)) & ~nan
    held = decisive.copy()
    for j in np.flatnonzero(over.any(axis=0)):
        rows = np.flatnonzero(~nan[:, j])  # the steps both runs measured, in order
        parted = over[rows, j]
        for k in np.flatnonzero(parted):
            window = parted[k:k + PERSIST]  # the next `PERSIST` measured steps
            if 2 * window.sum() > len(window) >= WINDOW_MIN:
                held[rows[k], j] = True
    return held, threshold


def _first_events(events: list[Event]) -> dict[tuple[str, str | None], Event]:
    first: dict[tuple[str, str | None], Event] = {}
    for e in events:
        if e.severity in LEVEL:
            first.setdefault((e.kind, e.layer), e)
    return first


def compare(a: Run | str | Path, b: Run | str | Path) -> Comparison:
    """Where two runs (or saved runs' paths) part, and the events one has and the other
    lacks (see the module's docstring)."""
    run_a, name_a = _as_run(a)
    run_b, name_b = _as_run(b)
    if name_a == name_b:
        name_a, name_b = f"{name_a} (a)", f"{name_b} (b)"
    ta, tb = run_a.trace, run_b.trace
    names_b = {n: j for j, n in enumerate(tb.layer_names)}
    shared = [(i, names_b[n]) for i, n in enumerate(ta.layer_names) if n in names_b]
    ia = np.array([i for i, _ in shared], int)
    ib = np.array([j for _, j in shared], int)
    steps_a, _ = ta.history("loss")
    steps_b, _ = tb.history("loss")
    steps, ra, rb = np.intersect1d(steps_a, steps_b, return_indices=True)
    candidates: list[Parting] = []

    def first_parting(quantity: str, xa: np.ndarray, xb: np.ndarray, raw_a: np.ndarray,
                      raw_b: np.ndarray, floor: float, layers: list[str | None],
                      forward: bool, both: np.ndarray | None = None) -> None:
        if xa.size == 0:
            return
        held, threshold = _parted(xa, xb, floor, both)
        rows = np.flatnonzero(held.any(axis=1))
        if not len(rows):
            return
        t = int(rows[0])
        cols = np.flatnonzero(held[t])
        c = int(cols[0] if forward else cols[-1])
        candidates.append(Parting(int(steps[t]), layers[c], quantity, float(raw_a[t, c]),
                                  float(raw_b[t, c]), float(threshold[c])))

    layer_names: list[str | None] = [ta.layer_names[i] for i in ia]
    for q, forward in QUANTITIES:
        va = ta.history(q)[1][ra][:, ia].astype(float)
        vb = tb.history(q)[1][rb][:, ib].astype(float)
        both = ~(np.isnan(va) | np.isnan(vb))
        if q in SOME_STEPS:
            va, vb = _one_sided(va, vb)
        first_parting(q, _log(va), _log(vb), va, vb, MIN_DECADES, layer_names, forward, both)
    la = ta.history("loss")[1][ra].astype(float)[:, None]
    lb = tb.history("loss")[1][rb].astype(float)[:, None]
    finite = np.concatenate([la[np.isfinite(la)], lb[np.isfinite(lb)]])
    if len(finite) and (finite > 0).all():
        first_parting("loss", _log(la), _log(lb), la, lb, LOSS_DECADES, [None], True)
    elif len(finite):
        xa, xb = np.where(np.isfinite(la), la, np.inf), np.where(np.isfinite(lb), lb, np.inf)
        first_parting("loss", xa, xb, la, lb, 0.0, [None], True)
    parting = _choose(candidates, layer_names)
    if parting is None:
        parting = _health_parting(run_a, run_b, steps, shared, layer_names)
    ea, eb = _first_events(run_a.events), _first_events(run_b.events)
    return Comparison(name_a, name_b, len(steps), [n for n in layer_names if n is not None],
                      parting, [e for k, e in ea.items() if k not in eb],
                      [e for k, e in eb.items() if k not in ea])


def _choose(candidates: list[Parting], order: list[str | None]) -> Parting | None:
    """The earliest parting; at one step, where the difference starts (module docstring):
    `order` is the layers' forward order."""
    if not candidates:
        return None
    step = min(p.step for p in candidates)
    at = [p for p in candidates if p.step == step]
    rank = {name: i for i, name in enumerate(order)}
    for quantity, forward in QUANTITIES:
        found = [p for p in at if p.quantity == quantity]
        if found:
            pick = min if forward else max
            return pick(found, key=lambda p: rank.get(p.layer, -1))
    return at[0]


def _health_parting(run_a: Run, run_b: Run, steps: np.ndarray, shared: list[tuple[int, int]],
                    names: list[str | None]) -> Parting | None:
    """The first step and layer in error in one run and not in the other."""
    if not len(steps) or not shared:
        return None
    da = run_a.states.dense()[steps][:, [i for i, _ in shared]] == LEVEL["error"]
    db = run_b.states.dense()[steps][:, [j for _, j in shared]] == LEVEL["error"]
    hit = np.argwhere(da != db)
    if not len(hit):
        return None
    t, c = (int(x) for x in hit[0])
    return Parting(int(steps[t]), names[c], "health", float(da[t, c]), float(db[t, c]), 0.0)
