"""neuraldbg_nb: find the first failure of a PyTorch training, layer and step.

Importing this package imports neither IPython nor anywidget nor altair; the notebook
parts load when `%load_ext neuraldbg_nb` or a view asks for them.
"""

from .capture import Capture
from .detectors import detect
from .events import Event, Kind
from .run import Run, TrainingFailure, load
from .thresholds import Thresholds
from .watcher import last_run, watch

__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext neuraldbg_nb`: registers the `%%neuraldbg` cell magic."""
    from .magic import load_ipython_extension as load

    load(ipython)


__all__ = ["Capture", "Event", "Kind", "Run", "Thresholds", "TrainingFailure", "detect",
           "last_run", "load", "load_ipython_extension", "watch"]
