"""A run as one self-contained HTML page: opens from disk, offline, in any browser.

`neuraldbg report RUN.npz -o report.html` and `run.to_html(path)` write it: a header (steps,
layers, how training ended, what watching cost), the loss and the health map as inline SVG,
the first failure and its likely causes (`report.static`), the event feed, and for each
captured step of a live run the inspector's numbers (the layer's recorded numbers at that
step and each captured tensor's summary). No script, no font, no stylesheet from anywhere.
"""

from __future__ import annotations

import html
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..trace.columns import LAYER_COLUMNS
from .static import FONT, SEVERITY_COLORS, diagnosis_html, health_svg

if TYPE_CHECKING:
    from .captures import Capture
    from .run import Run

MAX_FEED = 500
"""Events listed in the feed at most (the first failure is always among them)."""
MAX_CAPTURES = 60
"""Captured steps given numbers at most (event captures first)."""
STYLE = f"""
body {{{FONT};margin:24px;color:#222;background:#fff;max-width:1000px}}
h1 {{font-size:20px;margin:0 0 4px}} h2 {{font-size:16px;margin:22px 0 6px}}
table {{border-collapse:collapse;font-size:12px}}
td,th {{border-bottom:1px solid #e3e3e3;padding:2px 8px;text-align:left;vertical-align:top}}
tr.error td:first-child {{box-shadow:inset 4px 0 0 {SEVERITY_COLORS["error"]}}}
tr.warning td:first-child {{box-shadow:inset 4px 0 0 {SEVERITY_COLORS["warning"]}}}
tr.info td:first-child {{box-shadow:inset 4px 0 0 {SEVERITY_COLORS["info"]}}}
.meta {{color:#555;font-size:13px}} code {{font-size:12px}}
"""


def layer_numbers(run: Run, layer: int, step: int) -> dict[str, tuple[float, int]]:
    """The layer's recorded numbers at `step`, each with the step it was measured at
    (sampled statistics come from the nearest sampled step at or before it)."""
    out = {}
    for c in LAYER_COLUMNS:
        steps, values = run.trace.history(c)
        upto = int(np.searchsorted(steps, step, side="right"))
        col = values[:upto, layer]
        seen = np.flatnonzero(~np.isnan(col))
        if len(seen):
            out[c] = (float(col[seen[-1]]), int(steps[seen[-1]]))
    return out


def loss_svg(run: Run, width: int = 480, height: int = 60) -> str:
    """The loss over the run as a polyline (finite values only; a gap where it was not)."""
    steps, loss = run.trace.history("loss")
    keep = np.isfinite(loss)
    if keep.sum() < 2:
        return ""
    s, v = steps[keep].astype(float), loss[keep].astype(float)
    lo, hi = float(v.min()), float(v.max())
    log = lo > 0 and hi / lo > 100  # a spike on a linear axis flattens the rest
    y_of = np.log10 if log else (lambda x: x)
    y, y_lo, y_hi = y_of(v), y_of(lo), y_of(hi)
    span_s = max(float(run.trace.n_steps - 1), 1.0)
    span_v = float(y_hi - y_lo) or 1.0
    pts = " ".join(f"{4 + (x / span_s) * (width - 8):.1f},"
                   f"{4 + (1 - (yy - y_lo) / span_v) * (height - 8):.1f}"
                   for x, yy in zip(s, y))
    scale = " (log scale)" if log else ""
    return (f'<svg width="{width}" height="{height}" '
            f'role="img" aria-label="loss from {v[0]:.4g} to {v[-1]:.4g}">'
            f'<polyline points="{pts}" fill="none" stroke="#4c78a8" stroke-width="1.2"/>'
            f'<text x="4" y="10" font-size="9" fill="#555">loss {hi:.4g}{scale}</text>'
            f'<text x="4" y="{height - 2}" font-size="9" fill="#555">{lo:.4g}</text></svg>')


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def _header(run: Run) -> str:
    t = run.trace
    source = f" from {html.escape(str(run.loaded_from))}" if run.loaded_from else ""
    cost = run.overhead
    bits = [f"{t.n_steps} steps", f"{t.n_layers} layers", f"training {run.status_text}"]
    if run.rank is not None:
        bits.append(f"rank {run.rank[0]} of {run.rank[1]}")
    if cost is not None:
        bits.append(html.escape(str(cost)))
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"<h1>neuraldbg report</h1><div class='meta'>{', '.join(bits)}. "
            f"Written {when}{source}.</div>")


def _feed(run: Run) -> str:
    events = run.events
    root = run.first_failure
    shown = events[:MAX_FEED]
    if root is not None and all(e is not root for e in shown):
        shown = [root, *shown[:MAX_FEED - 1]]
    if not shown:
        return "<p>No event.</p>"
    symptom = {id(e) for e in run.symptoms}
    esc = html.escape
    rows = []
    for e in shown:
        role = ("first failure" if e is root else "symptom" if id(e) in symptom else "")
        rows.append(f"<tr class='{esc(e.severity)}'><td>{e.step}</td>"
                    f"<td>{esc(e.layer or '')}</td><td>{esc(e.severity)}</td>"
                    f"<td>{esc(e.kind)}</td><td>{esc(role)}</td><td>{esc(e.message)}</td></tr>")
    more = (f"<p class='meta'>{len(events) - len(shown)} more events are left out.</p>"
            if len(events) > len(shown) else "")
    return ("<table><tr><th>step</th><th>layer</th><th>severity</th><th>kind</th><th></th>"
            "<th>what</th></tr>" + "".join(rows) + "</table>" + more)


def _tensor_rows(cap: Capture) -> str:
    rows = []
    for name, tensor in cap.tensors.items():
        # in float64: a float32 std squares values past 1.8e19 into inf
        x = tensor.detach().double().reshape(-1).numpy()
        finite = x[np.isfinite(x)]
        bad = len(x) - len(finite)
        stats = ((finite.mean(), finite.std(), finite.min(), finite.max()) if len(finite)
                 else (math.nan,) * 4)
        sampled = " (sampled)" if name in cap.sampled else ""
        rows.append(f"<tr><td>{html.escape(name)}{sampled}</td><td>{tuple(tensor.shape)}</td>"
                    + "".join(f"<td>{_fmt(float(v))}</td>" for v in stats)
                    + f"<td>{bad}</td></tr>")
    return ("<table><tr><th>tensor</th><th>shape</th><th>mean</th><th>std</th><th>min</th>"
            "<th>max</th><th>non-finite</th></tr>" + "".join(rows) + "</table>")


def _captures(run: Run) -> str:
    caps = list(run.captures)
    if not caps:
        why = ("the captured tensors are not saved with a run; write the report from the "
               "live run (run.to_html) to include them" if run.loaded_from is not None
               else "nothing was captured in this run")
        return f"<p class='meta'>No captured step: {why}.</p>"
    caps.sort(key=lambda c: (c.reason != "event", c.step, c.layer or ""))
    names = run.trace.layer_names
    out = []
    for cap in caps[:MAX_CAPTURES]:
        title = f"{cap.layer or 'the input batch'}, step {cap.step} ({cap.reason})"
        block = [f"<h3 style='font-size:14px;margin:14px 0 4px'>{html.escape(title)}</h3>"]
        if cap.layer in names:
            nums = layer_numbers(run, names.index(cap.layer), cap.step)
            block.append("<table>" + "".join(
                f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td><td class='meta'>"
                + ("" if at == cap.step else f"(step {at})") + "</td></tr>"
                for k, (v, at) in nums.items()) + "</table>")
        block.append(_tensor_rows(cap))
        out.append("".join(block))
    if len(caps) > MAX_CAPTURES:
        out.append(f"<p class='meta'>{len(caps) - MAX_CAPTURES} more captures are left "
                   f"out.</p>")
    return "".join(out)


def page(run: Run) -> str:
    """The whole report of `run` as one HTML document."""
    loss = loss_svg(run)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            "<title>neuraldbg report</title>"
            f"<style>{STYLE}</style></head><body>"
            + _header(run)
            + "<h2>Diagnosis</h2>" + diagnosis_html(run, with_map=False, panel_note=False)
            + (f"<h2>Loss</h2>{loss}" if loss else "")
            + "<h2>Health map</h2>" + (health_svg(run, width=900, row_height=12)
                                       or "<p>No layer was measured.</p>")
            + "<h2>Events</h2>" + _feed(run)
            + "<h2>Captured steps</h2>" + _captures(run)
            + "</body></html>")


def write(run: Run, path: str | Path) -> Path:
    """Write `page(run)` to `path` (UTF-8) and return the path."""
    path = Path(path)
    path.write_text(page(run), encoding="utf-8")
    return path
