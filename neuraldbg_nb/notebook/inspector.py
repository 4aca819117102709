"""The inspector: one layer at one step, as charts, numbers and the tensors themselves.

Charts are altair specs rendered to inline SVG with vl-convert, so they show offline and in
any front end (no CDN, no vega mimetype). Each chart declares the trace columns it needs
and is left out, with a line saying why, when they were not recorded.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from ..detect.gradients import explode_line
from ..report.captures import Capture
from ..report.run import Run

SERIES_POINTS = 1500
BINS = 40


def _series(run: Run, column: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one layer's column, finite values only, bucketed to the max so
    a long run stays a small chart."""
    steps, values = run.trace.history(column)
    v = values[:, layer].astype(np.float64)
    keep = np.isfinite(v) & (v > 0) if column in ("grad_norm", "act_absmax") else np.isfinite(v)
    steps, v = steps[keep], v[keep]
    if len(v) > SERIES_POINTS:
        edges = np.linspace(0, len(v), SERIES_POINTS + 1).astype(int)[:-1]
        top = np.maximum.reduceat(v, edges)
        steps, v = steps[edges], top
    return steps, v


def warm_up() -> None:
    """Load altair and the renderer (seconds, the first time in a process)."""
    import altair as alt
    import pandas as pd

    _svg(alt.Chart(pd.DataFrame({"x": [0, 1]})).mark_line().encode(x="x:Q"))


def _svg(chart: Any) -> str:
    import vl_convert as vlc

    return vlc.vegalite_to_svg(chart.to_dict())


def _line_chart(run: Run, column: str, title: str, layer: int, step: int,
                rules: dict[str, float]) -> str | None:
    """One column of one layer over the run, the selected step marked in red; threshold
    lines are drawn only where they fall near the data (a line decades away would squash
    the curve flat)."""
    import altair as alt
    import pandas as pd

    steps, values = _series(run, column, layer)
    if len(values) == 0:
        return None
    data = pd.DataFrame({"step": steps, "value": values})
    log = column in ("grad_norm", "act_absmax", "act_std")
    if log:
        values = values[values > 0]
        if len(values) == 0:
            return None
        lo, hi = float(values.min()) / 10, float(values.max()) * 10
        scale = alt.Scale(type="log", domain=[lo, hi])
    else:
        lo, hi, scale = -np.inf, np.inf, alt.Scale(zero=False)
    y = alt.Y("value:Q", scale=scale, title=title)
    layers = [alt.Chart(data).mark_line(color="#4c78a8", clip=True).encode(
        x=alt.X("step:Q", title="step"), y=y)]
    near = [{"threshold": k, "value": v} for k, v in rules.items() if lo <= v <= hi]
    if near:
        layers.append(alt.Chart(pd.DataFrame(near)).mark_rule(strokeDash=[4, 3], color="#888")
                      .encode(y=alt.Y("value:Q", scale=scale, title=title)))
    layers.append(alt.Chart(pd.DataFrame({"step": [step]})).mark_rule(color="#d62728")
                  .encode(x="step:Q"))
    far = [f"{k} {v:g}" for k, v in rules.items() if not lo <= v <= hi]
    subtitle = f"threshold off the chart: {', '.join(far)}" if far else ""
    chart = alt.layer(*layers).properties(
        width=300, height=140, title=alt.TitleParams(f"{title} of this layer", subtitle=subtitle))
    return _svg(chart.configure_axis(gridOpacity=0.35))


def _histograms(now: Capture, before: Capture | None) -> list[str]:
    """Histograms of the captured output, gradient and weight at the step, beside the
    last healthy capture of the layer (each on its own axis: a blown-up tensor and a
    healthy one rarely share a scale)."""
    import altair as alt
    import pandas as pd

    out = []
    for name in ("output", "grad", "weight"):
        if name not in now.tensors:
            continue
        charts: list[Any] = []
        for cap, label in ((now, f"step {now.step}"), (before, "last healthy")):
            if cap is None or name not in cap.tensors:
                continue
            x = cap.tensors[name].float().reshape(-1).numpy()
            finite = x[np.isfinite(x)]
            bad = len(x) - len(finite)
            if len(finite) == 0:
                charts.append(None)
                continue
            counts, edges = np.histogram(finite, bins=BINS)
            data = pd.DataFrame({"lo": edges[:-1], "hi": edges[1:], "count": counts})
            title = f"{name}, {label}" + (f" (step {cap.step})" if label != f"step {cap.step}"
                                          else "") + (f", {bad} non-finite" if bad else "")
            charts.append(alt.Chart(data).mark_bar(color="#4c78a8" if cap is now else "#9ecae9")
                          .encode(x=alt.X("lo:Q", title=None), x2="hi:Q",
                                  y=alt.Y("count:Q", title=None), y2=alt.datum(0))
                          .properties(width=200, height=100, title=title))
        drawn = [c for c in charts if c is not None]
        if not drawn:
            out.append(f"<p>{name}: no finite values captured</p>")
            continue
        out.append(_svg(alt.hconcat(*drawn).configure_axis(gridOpacity=0.35)))
    return out


def numbers(run: Run, layer: int, step: int) -> dict[str, tuple[float, int]]:
    """The layer's recorded numbers at `step`, each with the step it was measured at
    (sampled statistics come from the nearest sampled step at or before it)."""
    from ..trace.columns import LAYER_COLUMNS

    out = {}
    for c in LAYER_COLUMNS:
        steps, values = run.trace.history(c)
        upto = np.searchsorted(steps, step, side="right")
        col = values[:upto, layer]
        seen = np.flatnonzero(~np.isnan(col))
        if len(seen):
            out[c] = (float(col[seen[-1]]), int(steps[seen[-1]]))
    return out


def inspector_html(run: Run, layer: str | None, step: int) -> str:
    """The inspector's HTML for `layer` at `step` (layer None: the input batch)."""
    names = run.trace.layer_names
    step = int(np.clip(step, 0, max(run.trace.n_steps - 1, 0)))
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
        cap = run.inspect(layer, step) if layer is not None else _batch(run, step)
    except (LookupError, KeyError) as err:
        cap = None
        parts.append(f"<p>{esc(str(err))}</p>")
    if cap is not None:
        if cap.note:
            parts.append(f"<p class='ndbg-insp-note'>{esc(cap.note)}</p>")
        listing = ", ".join(f"{esc(k)} {tuple(v.shape)}" for k, v in cap.tensors.items())
        parts.append(
            "<p>In the kernel: <code>import neuraldbg_nb as ndbg; "
            "ndbg.last_run().selected.tensors[\"output\"]</code> "
            f"(captured: {listing}"
            + (f"; sampled: {esc(', '.join(sorted(cap.sampled)))}" if cap.sampled else "")
            + ")</p>")
    if layer in names:
        j = names.index(layer)
        nums = numbers(run, j, step)
        rows = "".join(f"<tr><td>{esc(k)}</td><td>{v:.4g}</td><td>"
                       + ("" if at == step else f"(step {at})") + "</td></tr>"
                       for k, (v, at) in nums.items())
        parts.append(f"<table class='ndbg-insp-numbers'>{rows}</table>")
        parts.append(_charts(run, j, step, cap))
    parts.append("</div>")
    return "".join(parts)


def _batch(run: Run, step: int) -> Capture | None:
    found = run.captures.find(step, None)
    if found is not None:
        run.selected = found
    return found


def _charts(run: Run, layer: int, step: int, cap: Capture | None) -> str:
    try:
        import altair  # noqa: F401
        import vl_convert  # noqa: F401
    except ImportError:
        return ("<p>charts need altair and vl-convert-python: "
                "pip install altair vl-convert-python</p>")
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
