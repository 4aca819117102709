"""The diagnosis of a run as static HTML: what a reader with no kernel and no network shows.

One fragment (`diagnosis_html`) for the notebook output beside the live panel (nbconvert,
GitHub, a restarted kernel) and for the offline report page (`report.page`): the headline,
the first failure with its layer, step and likely causes, the grouped events, and the
health map as a small inline SVG. Inline styles only (a reader may drop `<style>`), no
script, no external resource.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..detect.states import LEVEL
from . import story

if TYPE_CHECKING:
    from .run import Run

PALETTE = json.loads((Path(__file__).with_name("palette.json")).read_text(encoding="utf-8"))
"""The colors of the states and severities, light and dark: one file that the live panel
(`js/colors.ts`) and this static copy both read, so a severity has one color everywhere."""
STATE_COLORS = dict(enumerate(PALETTE["light"]["states"]))
"""Map code -> fill: no data, healthy, warning, error (`detect.states.LEVEL`), the panel's
light theme (a static page does not know the reader's theme)."""
SEVERITY_COLORS = {"healthy": STATE_COLORS[1], "warning": STATE_COLORS[LEVEL["warning"]],
                   "error": STATE_COLORS[LEVEL["error"]], "info": PALETTE["light"]["info"]}
"""Severity -> text or mark color, as the panel draws them."""
STATE_NAMES = {0: "no data", 1: "healthy", LEVEL["warning"]: "warning",
               LEVEL["error"]: "error"}
MAP_COLS = 120
"""Columns of the static map at most (steps are bucketed beyond, worst state per bucket)."""
MAP_ROWS = 48
"""Layers drawn at most; a deeper model's map says how many are left out."""
FONT = 'font-family:system-ui,-apple-system,"Segoe UI",sans-serif'


def health_svg(run: Run, width: int = 480, row_height: int = 8) -> str:
    """The health map as an inline SVG: one row per layer (the first `MAP_ROWS`), one
    column per bucket of steps, each cell the worst state of its layer there; the first
    failure's cell is outlined. Empty for a run with no step or no layer."""
    t = run.trace
    n_steps, n_layers = t.n_steps, t.n_layers
    if n_steps == 0 or n_layers == 0:
        return ""
    cols = min(n_steps, MAP_COLS)
    grid = run.states.bucketed(0, n_steps, cols)
    rows = min(n_layers, MAP_ROWS)
    label_w = 110
    cell_w = (width - label_w) / cols
    height = rows * row_height + 16
    esc = html.escape
    font = max(7, row_height - 3)
    parts = [(f'<svg width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="health map: {n_layers} layers x {n_steps} steps">')]
    for j in range(rows):
        y = j * row_height
        name = t.layer_names[j]
        parts.append(f'<text x="{label_w - 4}" y="{y + row_height - 1}" font-size="{font}" '
                     f'text-anchor="end" fill="#555">{esc(name[-22:])}</text>')
        c = 0
        while c < cols:  # one rect per run of equal cells: a small file for a long run
            code = int(grid[j, c])
            end = c
            while end + 1 < cols and int(grid[j, end + 1]) == code:
                end += 1
            parts.append(f'<rect x="{label_w + c * cell_w:.2f}" y="{y}" '
                         f'width="{(end - c + 1) * cell_w:.2f}" height="{row_height - 1}" '
                         f'fill="{STATE_COLORS.get(code, STATE_COLORS[0])}">'
                         f'<title>{esc(name)}: {STATE_NAMES.get(code, "")}</title></rect>')
            c = end + 1
    root = run.first_failure
    if root is not None and root.order >= 0 and root.order < rows:
        x = label_w + (root.step * cols // n_steps) * cell_w
        parts.append(f'<rect x="{x:.2f}" y="{root.order * row_height - 1}" '
                     f'width="{max(cell_w, 3):.2f}" height="{row_height + 1}" fill="none" '
                     f'stroke="#000" stroke-width="1.5"/>')
    axis_y = rows * row_height + 11
    parts.append(f'<text x="{label_w}" y="{axis_y}" font-size="8" fill="#555">step 0</text>')
    parts.append(f'<text x="{width}" y="{axis_y}" font-size="8" text-anchor="end" '
                 f'fill="#555">step {n_steps - 1}</text>')
    parts.append("</svg>")
    if n_layers > rows:
        parts.append(f"<div style='font-size:11px;color:#555'>(the first {rows} of "
                     f"{n_layers} layers)</div>")
    return "".join(parts)


def failure_sentence(run: Run) -> str:
    """The first failure in one line: what, at which step and where; or why there is none."""
    root = run.first_failure
    if root is None:
        return story.headline(run)
    return f"First failure: step {root.step}, {story._where(root)}: {root.message}"


def diagnosis_html(run: Run, with_map: bool = True, panel_note: bool = True) -> str:
    """The diagnosis as one self-contained HTML fragment (see the module's docstring);
    `panel_note` adds the line that says it stands in for the live panel."""
    esc = html.escape
    root = run.first_failure
    colour = SEVERITY_COLORS["error"] if root is not None else "inherit"
    headline, sentence = story.headline(run), failure_sentence(run)
    out = [(f"<div class='ndbg-static' style='{FONT};font-size:13px;line-height:1.4;"
           f"border:1px solid #ccc;border-radius:4px;padding:8px 10px;max-width:720px'>"),
           f"<div style='font-weight:600'>{esc(headline)}</div>"]
    if sentence != headline:  # with no failure, the sentence is the headline: said once
        out.append(f"<div style='color:{colour};margin-top:4px'>{esc(sentence)}</div>")
    if root is not None:
        causes = run.likely_causes
        if causes:
            out.append("<div style='margin-top:4px'>Likely causes:<ul style='margin:2px 0'>"
                       + "".join(f"<li>{esc(str(c))}</li>" for c in causes) + "</ul></div>")
        follow = story.group(run.symptoms)
        if follow:
            out.append("<div style='margin-top:4px'>What followed:<ul style='margin:2px 0'>"
                       + "".join(f"<li>{esc(line)}</li>" for line in follow) + "</ul></div>")
    before = [e for e in run.events if e.severity != "info"
              and (root is None or e.step < root.step)]
    if before:
        title = "Before it" if root is not None else "Events"
        out.append(f"<div style='margin-top:4px'>{title}:<ul style='margin:2px 0'>"
                   + "".join(f"<li>{esc(line)}</li>" for line in story.group(before))
                   + "</ul></div>")
    if run.status not in ("finished", "training"):
        out.append(f"<div style='margin-top:4px'>Training {esc(run.status_text)}.</div>")
    out += [f"<div style='margin-top:4px;color:#555'>Note: {esc(n)}</div>" for n in run.notes]
    if with_map:
        svg = health_svg(run)
        if svg:
            out.append(f"<div style='margin-top:6px'>{svg}</div>")
    if panel_note:
        out.append("<div style='margin-top:4px;font-size:11px;color:#777'>A static copy of "
                   "the neuraldbg panel: it needs no kernel. The live panel (clicks, sliders) "
                   "shows where its kernel runs; <code>neuraldbg_nb.show(path)</code> opens "
                   "a saved run in one (<code>%%neuraldbg --save path</code> saves the "
                   "cell's).</div>")
    out.append("</div>")
    return "".join(out)
