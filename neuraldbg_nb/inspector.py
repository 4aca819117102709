"""The inspector: one layer at one step, as charts, numbers and the tensors themselves.

Charts are altair specs rendered to inline SVG with vl-convert, so they show offline and in
any front end (no CDN, no vega mimetype). Each chart declares the trace columns it needs
and is left out, with a line saying why, when they were not recorded.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from .capture import Capture
from .run import Run

SERIES_POINTS = 1500
BINS = 40


def _series(run: Run, column: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one layer's column, finite values only, bucketed to the max so
    a long run stays a small chart."""
    v = run.trace.col(column)[:, layer].astype(np.float64)
    steps = np.arange(len(v))
    keep = np.isfinite(v) & (v > 0) if column in ("grad_norm", "act_absmax") else np.isfinite(v)
    steps, v = steps[keep], v[keep]
    if len(v) > SERIES_POINTS:
        edges = np.linspace(0, len(v), SERIES_POINTS + 1).astype(int)[:-1]
        top = np.maximum.reduceat(v, edges)
        steps, v = steps[edges], top
    return steps, v


def _svg(chart: Any) -> str:
    import vl_convert as vlc

    return vlc.vegalite_to_svg(chart.to_dict())


def _line_chart(run: Run, column: str, title: str, layer: int, step: int,
                rules: dict[str, float]) -> str | None:
    import altair as alt
    import pandas as pd

    steps, values = _series(run, column, layer)
    if len(values) == 0:
        return None
    data = pd.DataFrame({"step": steps, title: values})
    log = column in ("grad_norm", "act_absmax")
    y = alt.Y(f"{title}:Q", scale=alt.Scale(type="log") if log else alt.Undefined)
    layers = [alt.Chart(data).mark_line(color="#4c78a8").encode(x="step:Q", y=y)]
    rule_rows = [{"name": k, "value": v} for k, v in rules.items()]
    if rule_rows:
        layers.append(alt.Chart(pd.DataFrame(rule_rows)).mark_rule(strokeDash=[4, 3], color="#999")
                      .encode(y="value:Q", tooltip=["name:N", "value:Q"]))
    layers.append(alt.Chart(pd.DataFrame({"step": [step]})).mark_rule(color="#d62728")
                  .encode(x="step:Q"))
    chart = alt.layer(*layers).properties(width=300, height=140, title=f"{title} of this layer")
    return _svg(chart)


def _histograms(now: Capture, before: Capture | None) -> list[str]:
    import altair as alt
    import pandas as pd

    out = []
    for name in ("output", "grad", "weight"):
        if name not in now.tensors:
            continue
        frames = []
        for cap, label in ((now, f"step {now.step}"), (before, "last healthy")):
            if cap is None or name not in cap.tensors:
                continue
            x = cap.tensors[name].float().reshape(-1).numpy()
            x = x[np.isfinite(x)]
            if len(x) == 0:
                continue
            counts, edges = np.histogram(x, bins=BINS)
            frames.append(pd.DataFrame({"lo": edges[:-1], "hi": edges[1:], "count": counts,
                                        "capture": f"{label} (step {cap.step})"}))
        if not frames:
            out.append(f"<p>{name}: no finite values captured</p>")
            continue
        data = pd.concat(frames)
        chart = alt.Chart(data).mark_bar(opacity=0.55).encode(
            x=alt.X("lo:Q", title=name), x2="hi:Q", y=alt.Y("count:Q", stack=None),
            color=alt.Color("capture:N", legend=alt.Legend(orient="bottom", title=None)),
        ).properties(width=260, height=120, title=f"{name} histogram")
        out.append(_svg(chart))
    return out


def numbers(run: Run, layer: int, step: int) -> dict[str, float]:
    """The layer's recorded numbers at `step` (sampled ones from the nearest sampled step
    at or before it)."""
    from .trace import LAYER_COLUMNS

    out = {}
    for c in LAYER_COLUMNS:
        col = run.trace.col(c)[: step + 1, layer]
        seen = np.flatnonzero(~np.isnan(col))
        if len(seen):
            out[c] = float(col[seen[-1]])
    return out


def inspector_html(run: Run, layer: str | None, step: int) -> str:
    """The inspector's HTML for `layer` at `step` (layer None: the input batch)."""
    names = run.trace.layer_names
    step = int(np.clip(step, 0, max(run.trace.n_steps - 1, 0)))
    esc = html.escape
    parts = [f"<div class='ndbg-insp'><h4>{esc(layer or 'input batch')} at step {step}</h4>"]
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
        rows = "".join(f"<tr><td>{esc(k)}</td><td>{v:.4g}</td></tr>" for k, v in nums.items())
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
                "pip install 'neuraldbg_nb[notebook]'</p>")
    th = run.thresholds
    charts = [
        _line_chart(run, "grad_norm", "gradient norm", layer, step,
                    {"vanish": th.vanish, "explode": th.explode}),
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
