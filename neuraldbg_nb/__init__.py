"""neuraldbg_nb: find the first failure of a PyTorch training, layer and step.

Importing this package imports neither IPython nor anywidget nor the chart renderer; the notebook
parts load when `%load_ext neuraldbg_nb` or a view asks for them. Imported in a running
IPython kernel, it registers `%%neuraldbg` there too (as `%load_ext neuraldbg_nb` does).
"""

import importlib.metadata as _metadata
import sys as _sys

from .detect import detect
from .detect.events import Event, Kind
from .detect.thresholds import Thresholds
from .live.watcher import last_run, runs, watch
from .report.captures import Capture
from .report.compare import Comparison, compare
from .report.run import Run, TrainingFailure, load

try:  # pyproject.toml is the one place that sets it; the installed metadata carries it
    __version__ = _metadata.version("neuraldbg_nb")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"


def show(run: Run | str, baseline: Run | str | None = None) -> None:
    """Display the panel of a run, or of a run saved at a path, in a notebook: its map,
    first failure and feed, with clicks and sliders; with `baseline` (another run or path),
    where the two part (`notebook.show`)."""
    from .notebook.show import show as show_panel

    show_panel(run, baseline)


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext neuraldbg_nb`: registers the `%%neuraldbg` cell magic."""
    from .notebook.magic import load_ipython_extension as load

    load(ipython)


__all__ = ["Capture", "Comparison", "Event", "Kind", "Run", "Thresholds", "TrainingFailure",
           "compare", "detect", "last_run", "load", "load_ipython_extension", "runs", "show",
           "watch"]


def _register_in_running_ipython() -> None:
    """`import neuraldbg_nb` in a notebook makes `%%neuraldbg` available: where IPython is
    already running (never imported here), load this extension into its shell."""
    if "IPython" not in _sys.modules:
        return
    shell = _sys.modules["IPython"].get_ipython()
    manager = getattr(shell, "extension_manager", None)
    if manager is not None and __name__ not in manager.loaded:
        try:
            manager.load_extension(__name__)
        except Exception:  # noqa: BLE001 - importing must not fail; %load_ext says why
            return


_register_in_running_ipython()
