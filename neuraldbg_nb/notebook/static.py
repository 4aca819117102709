"""The diagnosis in the notebook for readers without the panel's kernel.

The magic (and `show`) put a second output after the panel when the cell ends: the run's
diagnosis as text/plain and text/html (`report.static`: no script, no network). Whatever
shows a notebook without its kernel shows it: nbconvert's HTML, GitHub's notebook view,
JupyterLab and Notebook 7 after a restart (where a widget's view says only that its model
is gone, a widget manager never falls back to another type of the widget's own output).
While the live panel is drawn above it in the same output area, the output's own style
rule hides it (`HIDE_WHILE_LIVE`), so the user sees the panel, not two copies.

The panel's own output keeps its widget view and says in text/plain what it is (never a
repr with an address).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..report import story
from ..report.static import diagnosis_html

if TYPE_CHECKING:
    from ..report.run import Run

PANEL_ROOT = "ndbg-panel"
"""The class of the live panel's root element (`js/index.ts`)."""
HIDE_WHILE_LIVE = (f"<style>.jp-OutputArea-child:has(.{PANEL_ROOT}) ~ .jp-OutputArea-child "
                   f".ndbg-static {{display: none}}</style>")
"""Hides the diagnosis where a drawn panel precedes it in the same cell's output (JupyterLab,
Notebook 7); a reader that drops the rule, or draws no panel, shows it."""
PANEL_TEXT = ("neuraldbg panel (a live widget, drawn where its kernel runs; the diagnosis "
              "follows as text)")


def panel_bundle(bundle: Any) -> Any:
    """A widget's `_repr_mimebundle_` (a dict, or (data, metadata)) with `PANEL_TEXT` as its
    text/plain."""
    data, meta = bundle if isinstance(bundle, tuple) else (bundle, None)
    data = {**(data or {}), "text/plain": PANEL_TEXT}
    return data if meta is None else (data, meta)


def diagnosis_bundle(run: Run) -> dict[str, str]:
    """The run's diagnosis as text/plain (the story) and text/html."""
    return {"text/plain": story.tell(run), "text/html": HIDE_WHILE_LIVE + diagnosis_html(run)}


def show_diagnosis(run: Run) -> None:
    """Display the run's diagnosis as the next output of the running cell."""
    from IPython.display import display

    display(diagnosis_bundle(run), raw=True)
