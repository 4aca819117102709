"""`neuraldbg_nb.show(run_or_path)`: the panel of a finished or saved run in a notebook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..report.run import Run, load
from .static import show_diagnosis


def show(run: Run | str | Path) -> Any:
    """Display the panel of `run` (a Run, or the path of a saved one: `Run.save`): its map,
    first failure and feed, clicks that open the inspector and sliders that re-classify it.
    A loaded run has no captured tensors: the inspector gives its recorded numbers and
    charts. The diagnosis follows it as text, for readers without the kernel
    (`notebook.static`). Returns the panel."""
    if not isinstance(run, Run):
        path = Path(run)
        if not path.exists() and not path.with_suffix(".npz").exists():
            raise FileNotFoundError(f"no saved run at {path}: save one with run.save(path) "
                                    f"or `neuraldbg run --save RUN.npz script.py`")
        run = load(path)
    from IPython.display import display

    from .panel import Panel

    if run.status != "training":
        run.prepare_reclassify()  # the first slider move is as fast as the next
    panel = Panel(run)
    display(panel)
    show_diagnosis(run)  # for readers without the kernel (`notebook.static`)
    return panel
