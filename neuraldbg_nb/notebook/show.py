"""`neuraldbg_nb.show(run_or_path)`: the panel of a finished or saved run in a notebook."""

from __future__ import annotations

from pathlib import Path

from ..report.run import Run, load
from .static import show_diagnosis


def _load(run: Run | str | Path) -> Run:
    return run if isinstance(run, Run) else load(run)


def show(run: Run | str | Path, baseline: Run | str | Path | None = None) -> None:
    """Display the panel of `run` (a Run, or the path of a saved one: `Run.save`): its map,
    first failure and feed, clicks that open the inspector and sliders that re-classify it.
    A loaded run has no captured tensors: the inspector gives its recorded numbers and
    charts. With `baseline` (a run of the same recipe, or its path), the panel says where
    `run` parts from it and marks that step and layer on the map (`neuraldbg_nb.compare`).
    The diagnosis follows it as text, for readers without the kernel (`notebook.static`).
    Returns nothing: the panel is shown once, also where the call is a cell's last line."""
    run = _load(run)
    base = None if baseline is None else _load(baseline)
    from IPython.display import display

    from .panel import Panel

    if run.status != "training":
        run.prepare_reclassify()  # the first slider move is as fast as the next
    named = None if baseline is None or isinstance(baseline, Run) else Path(baseline).name
    panel = Panel(run, baseline=base, baseline_name=named)
    display(panel)
    compared = panel.baseline["sentence"] if panel.baseline else None
    show_diagnosis(run, compared)  # for readers without the kernel (`notebook.static`)
