"""The diagnosis in the notebook for readers without the panel's kernel.

The magic (and `show`) put a second output after the panel when the cell ends: the run's
diagnosis as text/plain and text/html (`report.static`: no script, no network). Whatever
shows a notebook without its kernel shows it: nbconvert's HTML, GitHub's notebook view,
JupyterLab and Notebook 7 after a restart (where a widget's view says only that its model
is gone, a widget manager never falls back to another type of the widget's own output).
While the live panel is drawn above it in the same output area, the output's own style
rule hides it (`HIDE_WHILE_LIVE`), so the user sees the panel, not two copies; once the
panel's kernel is gone (shut down, restarted) the rule lets it show again.

The panel's own output keeps its widget view and says in text/plain what it is (never a
repr with an address).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from ..report import story
from ..report.static import diagnosis_html

if TYPE_CHECKING:
    from ..report.run import Run

PANEL_ROOT = "ndbg-panel"
"""The class of the live panel's root element (`js/index.ts`)."""
PANEL_GONE = "ndbg-gone"
"""The class the panel's root takes when its kernel is gone (`js/requests.ts`)."""
HIDE_WHILE_LIVE = (f"<style>.jp-OutputArea-child:has(.{PANEL_ROOT}:not(.{PANEL_GONE})) ~ "
                   f".jp-OutputArea-child .ndbg-static {{display: none}}</style>")
"""Hides the diagnosis where a live panel precedes it in the same cell's output (JupyterLab,
Notebook 7); a reader that drops the rule, draws no panel (a restarted kernel: the widget's
view is gone), or a panel whose kernel is gone, shows it."""
PANEL_TEXT = ("neuraldbg panel (a live widget, drawn where its kernel runs; the diagnosis "
              "follows as text)")


def panel_bundle(bundle: Any) -> Any:
    """A widget's `_repr_mimebundle_` (a dict, or (data, metadata)) with `PANEL_TEXT` as its
    text/plain."""
    data, meta = bundle if isinstance(bundle, tuple) else (bundle, None)
    data = {**(data or {}), "text/plain": PANEL_TEXT}
    return data if meta is None else (data, meta)


def diagnosis_bundle(run: Run, compared: str | None = None) -> dict[str, str]:
    """The run's diagnosis as text/plain (the story) and text/html; `compared`, where the
    panel shows a baseline, is the comparison's sentence (`panel_state.baseline`), said
    after the story."""
    text, fragment = story.tell(run), diagnosis_html(run)
    if compared:
        text += f"\n  {compared}"
        line = (f"<div class='ndbg-static-compared' style='margin-top:4px'>"
                f"{html.escape(compared)}</div>")
        end = fragment.rindex("</div>")  # inside the diagnosis' own box
        fragment = fragment[:end] + line + fragment[end:]
    return {"text/plain": text, "text/html": HIDE_WHILE_LIVE + fragment}


def show_diagnosis(run: Run, compared: str | None = None) -> None:
    """Display the run's diagnosis (and `compared`: `diagnosis_bundle`) as the next output
    of the running cell."""
    from IPython.display import display

    display(diagnosis_bundle(run, compared), raw=True)
