"""The inspector: one layer at one step, as charts, numbers and the tensors themselves.

Charts are Vega-Lite specs rendered to inline SVG with vl-convert, so they show offline and in
any front end (no CDN, no vega mimetype). Each chart declares the trace columns it needs
and is left out, with a line saying why, when they were not recorded.
"""

from __future__ import annotations

import html
import threading
import weakref
from typing import Any

import numpy as np

from ..detect.gradients import explode_line
from ..report.captures import Capture
from ..report.page import layer_numbers
from ..report.run import Run
from .panel_state import handle

SERIES_POINTS = 1500
BINS = 40
LOG_COLUMNS = ("grad_norm", "act_absmax", "act_std")
"""Columns charted on a log axis (they span decades); their zeros are drawn on the axis's
floor and named, since a log axis has no zero."""


def _series(run: Run, column: str, layer: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One layer's column, split by how a chart draws it: "value" (finite, and nonzero on a
    log axis), "zero" (exactly 0, on a log axis) and "nonfinite" (inf: the trace records a
    non-finite tensor's statistic so), each as (steps, values); NaN, a step not measured,
    is left out. Each part is bucketed to its max, so a long run stays a small chart."""
    steps, values = run.trace.history(column)
    v = values[:, layer].astype(np.float64)
    measured = ~np.isnan(v)
    nonfinite = np.isinf(v)
    zero = (v == 0) if column in LOG_COLUMNS else np.zeros(len(v), bool)
    value = measured & ~nonfinite & ~zero
    out = {}
    for name, keep in (("value", value), ("zero", zero), ("nonfinite", nonfinite)):
        s, x = steps[keep], v[keep]
        if len(x) > SERIES_POINTS:
            edges = np.linspace(0, len(x), SERIES_POINTS + 1).astype(int)[:-1]
            s, x = s[edges], np.maximum.reduceat(x, edges)
        out[name] = (s, x)
    return out


_warm = threading.Lock()
_warmed = False


def warm_up() -> None:
    """Start the renderer (about a second, the first time in a process; at once after, and
    a second caller waits for the first)."""
    global _warmed
    with _warm:
        if _warmed:
            return
        _svg({"data": {"values": [{"x": 0}, {"x": 1}]}, "mark": "line",
              "encoding": {"x": {"field": "x", "type": "quantitative"}}})
        _warmed = True


def _svg(spec: dict[str, Any]) -> str:
    """A Vega-Lite spec as inline SVG on a transparent background, its grid faint: its text
    and grid take the panel's theme colours from CSS (`js/panel.css`, `.ndbg-insp-charts`).
    Specs are plain dicts, their data inline: a chart library's import would cost the
    first click seconds."""
    import vl_convert as vlc

    spec = {**spec, "background": "transparent", "config": {"axis": {"gridOpacity": 0.35}}}
    return vlc.vegalite_to_svg(spec)


def _points(**columns: Any) -> dict[str, Any]:
    """Inline data from equal-length columns (arrays or lists), as JSON numbers."""
    lists = {k: np.asarray(v, dtype=np.float64).tolist() for k, v in columns.items()}
    n = len(next(iter(lists.values())))
    return {"values": [{k: v[i] for k, v in lists.items()} for i in range(n)]}


def _quantitative(field: str, title: str | None, scale: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    out: dict[str, Any] = {"field": field, "type": "quantitative", "title": title}
    if scale is not None:
        out["scale"] = scale
    return out


def _line_chart(run: Run, column: str, title: str, layer: int, step: int,
                rules: dict[str, float]) -> str | None:
    """One column of one layer over the whole run (the x-axis spans every step), the
    selected step marked in red. Values a log axis cannot place are drawn, not dropped:
    exact zeros as hollow marks on the floor, non-finite values as red ticks along the
    top, each counted in the subtitle. Threshold lines are drawn only where they fall near
    the data (a line decades away would squash the curve flat)."""
    parts = _series(run, column, layer)
    steps, values = parts["value"]
    zero_steps, _ = parts["zero"]
    bad_steps, _ = parts["nonfinite"]
    if len(values) + len(zero_steps) + len(bad_steps) == 0:
        return None
    log = column in LOG_COLUMNS and len(values) > 0
    if log:
        lo, hi = float(values.min()) / 10, float(values.max()) * 10
    elif len(values):
        lo, hi = float(values.min()), float(values.max())
        pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    else:  # only zeros and non-finite values: a plain axis from 0
        lo, hi = 0.0, 1.0
    scale: dict[str, Any] = {"type": "log", "domain": [lo, hi]} if log else {"domain": [lo, hi]}
    last = max(run.trace.n_steps - 1, 1)
    x_scale = {"domain": [0, last], "nice": False}
    xy = {"x": _quantitative("step", "step", x_scale), "y": _quantitative("value", title, scale)}
    layers: list[dict[str, Any]] = []
    if len(values):
        layers.append({"data": _points(step=steps, value=values), "encoding": xy,
                       "mark": {"type": "line", "color": "#4c78a8", "clip": True,
                                "point": bool(len(values) < 3)}})
    if len(zero_steps):
        layers.append({"data": _points(step=zero_steps, value=np.full(len(zero_steps), lo)),
                       "encoding": xy,
                       "mark": {"type": "point", "shape": "circle", "filled": False,
                                "color": "#4c78a8", "size": 18, "clip": True}})
    if len(bad_steps):
        layers.append({"data": _points(step=bad_steps, value=np.full(len(bad_steps), hi)),
                       "encoding": xy,
                       "mark": {"type": "tick", "color": "#d62728", "thickness": 2, "size": 10,
                                "clip": True}})
    near = {k: v for k, v in rules.items() if lo <= v <= hi}
    if near:
        layers.append({"data": _points(value=list(near.values())),
                       "encoding": {"y": _quantitative("value", title, scale)},
                       "mark": {"type": "rule", "strokeDash": [4, 3], "color": "#888"}})
    layers.append({"data": _points(step=[step]),
                   "encoding": {"x": xy["x"]},
                   "mark": {"type": "rule", "color": "#d62728"}})
    far = [f"{k} {v:g}" for k, v in rules.items() if not lo <= v <= hi]
    notes = []
    if len(zero_steps):
        where = "on the floor" if log else "at 0"
        notes.append(f"exactly 0 at {len(zero_steps)} step(s) (o {where})")
    if len(bad_steps):
        notes.append(f"non-finite at {len(bad_steps)} step(s) (red ticks at the top)")
    if far:
        notes.append(f"threshold off the chart: {', '.join(far)}")
    return _svg({"layer": layers, "width": 300, "height": 140,
                 "title": {"text": f"{title} of this layer", "subtitle": notes or ""}})


def _histograms(now: Capture, before: Capture | None) -> list[str]:
    """Histograms of the captured output, gradient and weight at the step, beside the
    last healthy capture of the layer (each on its own axis: a blown-up tensor and a
    healthy one rarely share a scale)."""
    out = []
    for name in ("output", "grad", "weight"):
        if name not in now.tensors:
            continue
        charts: list[dict[str, Any] | None] = []
        for cap, label in ((now, f"step {now.step}"), (before, "last healthy")):
            if cap is None or name not in cap.tensors:
                continue
            x = cap.tensors[name].double().reshape(-1).numpy()  # (float32 bins overflow)
            finite = x[np.isfinite(x)]
            bad = len(x) - len(finite)
            if len(finite) == 0:
                charts.append(None)
                continue
            counts, edges = np.histogram(finite, bins=BINS)
            title = f"{name}, {label}" + (f" (step {cap.step})" if label != f"step {cap.step}"
                                          else "") + (f", {bad} non-finite" if bad else "")
            charts.append({
                "data": _points(lo=edges[:-1], hi=edges[1:], count=counts),
                "mark": {"type": "bar", "color": "#4c78a8" if cap is now else "#9ecae9"},
                "encoding": {"x": _quantitative("lo", None), "x2": {"field": "hi"},
                             "y": _quantitative("count", None), "y2": {"datum": 0}},
                "width": 200, "height": 100, "title": title})
        drawn = [c for c in charts if c is not None]
        if not drawn:
            out.append(f"<p>{name}: no finite values captured</p>")
            continue
        out.append(_svg({"hconcat": drawn}))
    return out


_cache: weakref.WeakKeyDictionary[Run, dict[tuple[str | None, int],
                                             tuple[str, Capture | None]]] = (
    weakref.WeakKeyDictionary())
_lock = threading.Lock()


def inspector_html(run: Run, layer: str | None, step: int) -> str:
    """The inspector's HTML for `layer` at `step` (layer None: the input batch), and the
    capture it shows becomes `run.selected`. Kept per run once made (`prepare` makes the
    likely first clicks when training ends), so a click is answered at once; a run is
    recorded whole by then and its thresholds are its own, so the HTML cannot go stale."""
    text, cap = _made(run, layer, step)
    if cap is not None:
        with _lock:  # not between a prepared lookup's select and its undo (`_capture`)
            run.selected = cap
    return text


def prepare(run: Run, limit: int = 4) -> None:
    """Make the inspector's HTML for the first failure and the first errors of other
    layers (what a user clicks first), selecting nothing: run in the background when
    training ends, while the user may click."""
    picks: list[tuple[str | None, int]] = []
    for e in [run.first_failure, *run.events]:
        if e is not None and e.severity == "error" and (e.layer, e.step) not in picks:
            picks.append((e.layer, e.step))
        if len(picks) >= limit:
            break
    for layer, step in picks:
        _made(run, layer, step)


def _made(run: Run, layer: str | None, step: int) -> tuple[str, Capture | None]:
    """(HTML, the capture it shows), from the run's cache or made (and kept, once the run
    has ended); `run.selected` is left alone."""
    step = int(np.clip(step, 0, max(run.trace.n_steps - 1, 0)))
    if run.status == "training":  # still growing: made afresh each time
        return _build(run, layer, step)
    key = (layer, step)
    with _lock:
        found = _cache.get(run, {}).get(key)
    if found is None:
        found = _build(run, layer, step)
        with _lock:
            _cache.setdefault(run, {})[key] = found
    return found


def _build(run: Run, layer: str | None, step: int) -> tuple[str, Capture | None]:
    names = run.trace.layer_names
    esc = html.escape
    label = layer or "the input batch"
    if layer in names:
        label = run.trace.layers[names.index(layer)].label
        state = {1: "healthy", 2: "warning", 3: "error"}[run.states.at(step, names.index(layer))]
        label += f", {state}"
    parts = [f"<div class='ndbg-insp'><p class='ndbg-insp-head'>{esc(label)}</p>"]
    events = [e for e in run.events if e.layer == layer and e.step == step]
    for e in events:
        parts.append(f"<p class='ndbg-insp-event ndbg-{e.severity}'>{esc(e.message)}</p>")
    try:
        cap = _capture(run, layer, step)
    except (LookupError, KeyError) as err:
        cap = None
        parts.append(f"<p>{esc(str(err))}</p>")
    if cap is not None:
        if cap.note:
            parts.append(f"<p class='ndbg-insp-note'>{esc(cap.note)}</p>")
        listing = ", ".join(f"{esc(k)} {tuple(v.shape)}" for k, v in cap.tensors.items())
        parts.append(
            "<p>In the kernel: <code>import neuraldbg_nb as ndbg; "
            f"{handle(run)}.selected.tensors[\"output\"]</code> "
            f"(captured: {listing}"
            + (f"; sampled: {esc(', '.join(sorted(cap.sampled)))}" if cap.sampled else "")
            + ")</p>")
    if layer in names:
        j = names.index(layer)
        nums = layer_numbers(run, j, step)
        rows = "".join(f"<tr><td>{esc(k)}</td><td>{v:.4g}</td><td>"
                       + ("" if at == step else f"(step {at})") + "</td></tr>"
                       for k, (v, at) in nums.items())
        parts.append(f"<table class='ndbg-insp-numbers'>{rows}</table>")
        parts.append(_charts(run, j, step, cap))
    parts.append("</div>")
    return "".join(parts), cap


def _capture(run: Run, layer: str | None, step: int) -> Capture | None:
    """`run.inspect(layer, step)` (the batch's capture for layer None) without selecting
    it: the selection is the user's click (`inspector_html`), never a prepared one."""
    if layer is None:
        return run.captures.find(step, None)
    with _lock:
        before = run.selected
        try:
            return run.inspect(layer, step)
        finally:
            run.selected = before


def _charts(run: Run, layer: int, step: int, cap: Capture | None) -> str:
    try:
        import vl_convert  # noqa: F401
    except ImportError:
        return "<p>charts need vl-convert-python: pip install vl-convert-python</p>"
    th = run.thresholds
    charts = [
        _line_chart(run, "grad_norm", "gradient norm", layer, step,
                    {"vanish": th.vanish, "explode": explode_line(run.trace, th)[0]}),
        _line_chart(run, "act_absmax", "activation abs-max", layer, step, {}),
        _line_chart(run, "act_std", "activation std", layer, step, {}),
    ]
    out = [c for c in charts if c is not None]
    if len(out) < len(charts):
        out.append("<p>some charts are left out: their numbers were not recorded for this "
                   "layer (no parameters, or no activation statistics)</p>")
    if cap is not None:
        out += _histograms(cap, run.last_healthy(cap))
    return "<div class='ndbg-insp-charts'>" + "".join(out) + "</div>"
