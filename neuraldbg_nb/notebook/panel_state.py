"""Run -> panel traits: all Python-to-JS conversion lives here.

Payloads are bounded whatever the run's length: the map is bucketed to at most
`MAX_COLS` columns (and fewer for very many layers), numbers travel as little-endian
binary (uint8 states, float32 values), the loss is downsampled, and the event feed is
capped. The JS side (`js/model.ts`) reads exactly these shapes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..detect.events import Event
from ..detect.thresholds import settings
from ..report import story
from ..report.compare import Comparison, compare
from ..report.run import Run

MAX_COLS = 240
MAX_CELLS = 32_000
"""Map cells per message (one byte each): with the capped feed, a live update stays under
64 KB."""
LOSS_POINTS = 256
MAX_EVENTS = 200
MAX_MARKERS = 400
LIVE_EVENTS = 60
LIVE_MARKERS = 150
"""While training the feed and markers are capped harder (the full lists come at the end)."""
NO_DATA = 0


def map_shape(n_steps: int, n_layers: int) -> int:
    """Columns of the map: one per step for short runs, bucketed beyond."""
    if n_steps == 0:
        return 0
    per_budget = MAX_CELLS // max(n_layers, 1)
    return int(max(1, min(n_steps, MAX_COLS, max(per_budget, 8))))


def bucket_edges(n_steps: int, cols: int) -> np.ndarray:
    """First step of each column (and the end): column c covers [edges[c], edges[c+1])."""
    return (np.arange(cols + 1) * n_steps) // max(cols, 1)


def state_map(run: Run, cols: int) -> np.ndarray:
    """(layers, cols) uint8: worst state per bucket; 0 before a layer was first measured."""
    n, n_layers = run.trace.n_steps, run.trace.n_layers
    out = run.states.bucketed(0, n, cols) if cols else np.zeros((n_layers, 0), np.uint8)
    first = first_measured(run)
    edges = bucket_edges(n, cols)
    for j in range(n_layers):
        before = np.searchsorted(edges[1:], first[j], side="right")
        out[j, :before] = NO_DATA
    return out


def first_measured(run: Run) -> np.ndarray:
    """Step at which each layer was first measured (n_steps if never)."""
    t = run.trace
    steps, act = t.history("act_absmax")
    _, grad = t.history("grad_norm")
    if len(steps) == 0:
        return np.zeros(t.n_layers, np.int64)
    seen = ~np.isnan(act) | ~np.isnan(grad)
    return np.where(seen.any(0), steps[seen.argmax(0)], t.n_steps)


def _bucket_rows(steps: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each bucket, whether the bucket has rows) for rows sorted by step."""
    first = np.searchsorted(steps, edges[:-1])
    has = first < np.searchsorted(steps, edges[1:])
    return np.minimum(first, max(len(steps) - 1, 0)), has


def bucket_max_log(run: Run, column: str, edges: np.ndarray) -> np.ndarray:
    """(layers, cols) float32: log10 of the largest finite value per bucket of steps (NaN
    if none); +inf where the bucket holds a non-finite value."""
    steps, values = run.trace.history(column)
    cols = len(edges) - 1
    if len(steps) == 0 or cols == 0:
        return np.full((run.trace.n_layers, cols), np.nan, np.float32)
    first, has = _bucket_rows(steps, edges)
    v = values.astype(np.float64)
    inf = np.isinf(v)
    v = np.where(np.isnan(v) | inf, -np.inf, v)
    peak = np.maximum.reduceat(v, first, axis=0)
    blown = np.logical_or.reduceat(inf, first, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(peak > 0, np.log10(np.maximum(peak, 1e-300)), np.nan)
    out[blown] = np.inf
    out[~has] = np.nan
    return out.T.astype(np.float32)


def loss_curve(run: Run, points: int = LOSS_POINTS) -> bytes:
    """Loss sparkline: mean per bucket of steps, NaN where missing or non-finite."""
    steps, loss = run.trace.history("loss")
    n = run.trace.n_steps
    if n == 0:
        return b""
    edges = bucket_edges(n, min(points, n))
    first, has = _bucket_rows(steps, edges)
    bad = ~np.isfinite(loss)
    sums = np.add.reduceat(np.where(bad, 0.0, loss), first)
    counts = np.add.reduceat((~bad).astype(np.float64), first)
    anybad = np.logical_or.reduceat(bad & ~np.isnan(loss), first)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(has & (counts > 0) & ~anybad, sums / counts, np.nan)
    return out.astype("<f4").tobytes()


def event_dict(e: Event, ident: int, cause: int | None) -> dict[str, Any]:
    return {"id": ident, "step": e.step, "layer": e.layer, "kind": e.kind,
            "severity": e.severity, "message": e.message, "symptom_of": cause}


def feed(run: Run, limit: int = MAX_EVENTS) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(events for the feed, first failure): the root cause, its symptoms, and other
    events; infos about learning rates and recoveries included. Capped to `limit`,
    keeping the root cause and the earliest events."""
    events = run.events
    root = run.first_failure
    ids = {id(e): i for i, e in enumerate(events)}
    root_id = ids[id(root)] if root is not None else None
    symptom = {id(e) for e in run.symptoms}
    rows = [event_dict(e, ids[id(e)], root_id if id(e) in symptom else None) for e in events]
    if len(rows) > limit:
        keep = rows[:limit]
        if root_id is not None and all(r["id"] != root_id for r in keep):
            keep = [rows[root_id]] + keep[: limit - 1]
        rows = keep
    first = None if root is None else event_dict(root, root_id or 0, None)
    return rows, first


def markers(run: Run, limit: int = MAX_MARKERS) -> list[dict[str, Any]]:
    """Where the map gets a tick: each warning or error of a layer, errors first."""
    marks = [{"row": e.order, "step": e.step, "kind": e.kind, "severity": e.severity}
             for e in run.events if e.order >= 0 and e.severity in ("warning", "error")]
    marks.sort(key=lambda m: (m["severity"] != "error", m["step"]))
    return marks[:limit]


SLIDER_LABELS = {"vanish": "vanishing grad <", "explode": "exploding grad >",
                 "jump": "regime jump \u00d7", "dead": "dead units \u2265",
                 "saturated": "saturated \u2265", "max_update": "weight update \u2265"}
"""The settings the panel has a slider for, in order, and each slider's label; the rest of
a slider (its default, span, scale and tooltip) is the setting's own (`Thresholds`)."""

SLIDER_COLUMNS = {"vanish": ("grad_norm",), "explode": ("grad_norm",),
                  "jump": ("grad_norm", "act_absmax"), "dead": ("dead_frac",),
                  "saturated": ("sat_frac",), "max_update": ("update_ratio",)}
"""The trace columns each slider's setting judges: a run that recorded none of them (no
ReLU-like layer, no bounded activation, no optimizer step) gets no slider for it, since
moving it could decide nothing there."""


def sliders(run: Run | None = None) -> list[dict[str, Any]]:
    """The sliders, for `js/sliders.ts`: key, label, help, default, min, max, log. With
    `run`, only those whose setting judges a column `run` recorded (`SLIDER_COLUMNS`)."""
    known = {s.name: s for s in settings()}
    out = []
    for key, label in SLIDER_LABELS.items():
        if run is not None and not _judges(run, SLIDER_COLUMNS[key]):
            continue
        s = known[key]
        if s.span is None:
            raise ValueError(f"Thresholds.{key} has a slider but no span: give its field "
                             f"metadata=_span(lo, hi) in detect/thresholds.py")
        out.append({"key": key, "label": label, "help": s.doc, "default": s.default,
                    "min": s.span[0], "max": s.span[1], "log": s.log})
    return out


def _judges(run: Run, columns: tuple[str, ...]) -> bool:
    """Did `run` record a value in any of `columns`?"""
    for column in columns:
        _, values = run.trace.history(column)
        if values.size and not np.isnan(values).all():
            return True
    return False


def thresholds(run: Run) -> dict[str, float]:
    """The run's values of the settings that have a slider."""
    return {key: getattr(run.thresholds, key) for key in SLIDER_LABELS}


def likely_causes(run: Run) -> list[str]:
    """The likely causes of the first failure, in sentences (`detect.causes`): the panel
    says them under it."""
    return [cause.text for cause in run.likely_causes]


def cost(run: Run) -> tuple[str, str]:
    """What watching costs, for the header: a short label, in milliseconds first (a toy
    model's 1 ms step makes any percentage look large), once the run is over with what
    the whole run cost (`Overhead.whole`), and the sentence behind it (with the budget
    note, where there is one); empty before it is measured."""
    o = run.overhead
    if o is None:
        return "", ""
    note = _budget_note(run)
    detail = f"{o}." + (f" {note}" if note else "")
    label = f"watching +{o.own_ms:.1f} ms/step (+{o.fraction:.1%}"
    if run.status != "training" and o.whole is not None:  # (a short run pays its start
        label += f"; the whole run +{o.whole:.1%}"  # and end on few steps)
    return label + ")", detail


def notes(run: Run) -> list[str]:
    """What the run could not watch, or stopped watching, in plain sentences (`run.notes`):
    shown under the header, where a warning printed in the cell's output scrolls away. The
    budget note is left out: it is the cost's tooltip (`cost`)."""
    own = _budget_note(run)
    return [n for n in run.notes if n != own]


def _budget_note(run: Run) -> str | None:
    """A live run's budget note (`SelfCost.note`); a loaded run's is in its notes only."""
    return run.cost.note if run.cost is not None else None


STATUSES = ("training", "finished", "stopped", "raised", "interrupted", "exited")
"""The run statuses the panel names (`Run.status`); any other reads as "raised"."""


def status(run: Run) -> str:
    """The header's status: the run's own, where the panel knows it."""
    return run.status if run.status in STATUSES else "raised"


BASELINE_EVENTS = 20
"""Events listed at most on each side of a comparison (the first of each kind and layer)."""


def baseline(run: Run, base: Run, name: str | None = None) -> dict[str, Any]:
    """Where `run` parts from the baseline run `base` (`report.compare`, `base` first), for
    the panel: the baseline's name, the one-line sentence, the parting's step, layer (None:
    the loss) and number, and the events each run has that the other lacks."""
    c = compare(base, run)
    p = c.parting
    name = name or (base.loaded_from.name if base.loaded_from is not None else "the baseline")
    return {"name": name, "sentence": comparison_sentence(c, name),
            "step": None if p is None else p.step, "layer": None if p is None else p.layer,
            "quantity": None if p is None else p.quantity,
            "row": -1 if p is None or p.layer not in run.trace.layer_names
            else run.trace.layer_names.index(p.layer),
            "only_run": [_only(e) for e in c.only_b[:BASELINE_EVENTS]],
            "only_baseline": [_only(e) for e in c.only_a[:BASELINE_EVENTS]]}


def comparison_sentence(c: Comparison, name: str) -> str:
    """The comparison's verdict (the first line of `Comparison.__str__`, after its heading):
    where they part, or that they do not, with the baseline `name` first."""
    verdict = str(c).split("\n", 1)[0].partition("): ")[2]
    return f"{name} vs this run ({c.steps} common steps): {verdict}"


def _only(e: Event) -> dict[str, Any]:
    return {"step": e.step, "layer": e.layer, "kind": e.kind, "severity": e.severity,
            "message": e.message}


def handle(run: Run) -> str:
    """Python that reaches `run` in its kernel: `ndbg.runs[i]` (`live.watcher.runs`), the
    same whichever panel shows it and however many cells trained after it."""
    from ..live.watcher import runs

    number = runs.number(run)
    return "ndbg.last_run()" if number is None else f"ndbg.runs[{number}]"


def header_state(run: Run) -> dict[str, Any]:
    """The traits of the panel's header: its status, step, loss and cost. A live update
    of these alone is a few hundred bytes whatever the run's size (`panel_budget`)."""
    label, detail = cost(run)
    return {"status": status(run), "step": run.trace.n_steps, "loss": loss_curve(run),
            "cost": label, "cost_detail": detail}


def panel_state(run: Run, with_values: bool, base: Run | None = None,
                base_name: str | None = None) -> dict[str, Any]:
    """Every trait of the panel for `run`. `with_values` adds the per-cell numbers for the
    tooltip (sent when the run is not training, to keep live messages small) and, with a
    baseline run `base`, where `run` parts from it (`baseline`; None without one)."""
    t = run.trace
    cols = map_shape(t.n_steps, t.n_layers)
    live = not with_values
    events, first = feed(run, LIVE_EVENTS if live else MAX_EVENTS)
    state: dict[str, Any] = {
        "layers": t.layer_names,
        **header_state(run),
        "map": np.ascontiguousarray(state_map(run, cols)).tobytes(),
        "map_cols": cols,
        "map_steps": [0, t.n_steps],
        "markers": markers(run, LIVE_MARKERS if live else MAX_MARKERS),
        "events": events,
        "first_failure": first,
        "likely_causes": likely_causes(run),
        "sliders": sliders() if live else sliders(run),
        "notes": notes(run) + [n for n in [story.watched_nothing(run)] if n],
        "baseline": baseline(run, base, base_name) if with_values and base is not None
        else None,
    }
    if with_values:
        edges = bucket_edges(t.n_steps, cols)
        state["map_values"] = bucket_max_log(run, "grad_norm", edges).astype("<f4").tobytes()
        state["map_act"] = bucket_max_log(run, "act_absmax", edges).astype("<f4").tobytes()
    return state
