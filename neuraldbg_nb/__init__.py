"""neuraldbg_nb: find the first failure of a PyTorch training, layer and step.

Importing this package imports neither IPython nor anywidget nor altair; the notebook
parts load when `%load_ext neuraldbg_nb` or a view asks for them.
"""

import importlib.metadata as _metadata

from .detect import detect
from .detect.events import Event, Kind
from .detect.thresholds import Thresholds
from .live.watcher import last_run, watch
from .report.captures import Capture
from .report.run import Run, TrainingFailure, load

try:  # pyproject.toml is the one place that sets it; the installed metadata carries it
    __version__ = _metadata.version("neuraldbg_nb")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext neuraldbg_nb`: registers the `%%neuraldbg` cell magic."""
    from .notebook.magic import load_ipython_extension as load

    load(ipython)


__all__ = ["Capture", "Event", "Kind", "Run", "Thresholds", "TrainingFailure", "detect",
           "last_run", "load", "load_ipython_extension", "watch"]
