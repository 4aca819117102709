"""What every framework callback does around a watch: open it on the framework's model,
follow the events it finds, say when training should stop, and save the run.

The callbacks never raise from inside the framework's loop: `stop_on="error"` asks the loop
to stop (Lightning's `trainer.should_stop`, transformers' `control.should_training_stop`),
so the framework ends its epoch, its loggers and its checkpoints as it always does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..detect.events import Event
from ..live.watcher import Watch, watch
from ..report.run import Run

RUN_FILE = "neuraldbg_run.npz"
"""The run's file in the framework's log or output folder (rank r of a run of several
processes: `neuraldbg_run.rank<r>.npz`)."""


class FrameworkWatch:
    """One watch over one `fit` / `train` call, for a framework callback.

    `options` are `watch()`'s keywords. `stop_on="error"` is kept here, not given to the
    watch: the callback asks the framework to stop at the end of the step whose error
    was found."""

    def __init__(self, options: dict[str, Any]) -> None:
        stop_on = options.pop("stop_on", "never")
        if stop_on not in ("error", "never"):
            raise ValueError(f"stop_on must be 'error' or 'never', got {stop_on!r}")
        options.pop("report", None)
        self.stop_on = stop_on
        self.options = options
        watch(None, **options)  # the options are checked now, when the callback is made
        self._watch: Watch | None = None
        self.run: Run | None = None
        self.new_events: list[Event] = []
        """Events found since the callback last took them (`take_events`)."""
        self.error_seen = False

    def __getstate__(self) -> dict[str, Any]:
        # a callback is pickled into spawned processes and checkpoints: never its live watch
        state = self.__dict__.copy()
        state.update(_watch=None, run=None, new_events=[], error_seen=False)
        return state

    @property
    def active(self) -> bool:
        return self._watch is not None

    def start(self, model: Any) -> Run:
        """Watch `model` from now on; a watch still open from an earlier call is closed."""
        self.stop(None)
        self._watch = watch(model, report=False, **self.options)
        self.run = self._watch.__enter__()
        self.run.sum_losses()  # frameworks scale micro-batch losses; they log the sum
        self.new_events, self.error_seen = [], False
        self.run.subscribe(self._heard)
        return self.run

    def _heard(self, run: Run, new: list[Event]) -> None:
        self.new_events.extend(new)
        self.error_seen = self.error_seen or any(e.severity == "error" for e in new)

    @property
    def should_stop(self) -> bool:
        return self.stop_on == "error" and self.error_seen

    def take_events(self) -> list[Event]:
        new, self.new_events = self.new_events, []
        return new

    def stop(self, exc: BaseException | None) -> Run | None:
        """Close the watch (its hooks are removed), with the exception the training ended
        on, if any; the run, or None where none was open."""
        w, self._watch = self._watch, None
        if w is None:
            return None
        w.__exit__(type(exc) if exc is not None else None, exc,
                   exc.__traceback__ if exc is not None else None)
        if self.run is not None and exc is None and self.should_stop:
            self.run.status = "stopped"  # the framework stopped at the callback's request
        return self.run

    def save_into(self, folder: str | Path | None) -> Path | None:
        """Save the run into `folder` (created if need be) as `RUN_FILE`, one file per
        rank; None where there is no run or no folder."""
        if self.run is None or folder is None:
            return None
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        name = RUN_FILE
        if self.run.rank is not None:
            name = name.replace(".npz", f".rank{self.run.rank[0]}.npz")
        return self.run.save(folder / name)

    def summary(self) -> dict[str, float]:
        """The event counts (and the first failure's step) as numbers for a logger."""
        run = self.run
        if run is None:
            return {}
        events = run.events
        out = {"neuraldbg/errors": float(sum(e.severity == "error" for e in events)),
               "neuraldbg/warnings": float(sum(e.severity == "warning" for e in events))}
        root = run.first_failure
        if root is not None:
            out["neuraldbg/first_failure_step"] = float(root.step)
        return out


def event_text(e: Event) -> str:
    """One event as a log line (its message names the layer and the step)."""
    return f"{e.severity}: {e.message}"


def show_panel(run: Run) -> None:
    """The live panel under the running notebook cell, where there is one."""
    if "IPython" not in sys.modules:
        return
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return
    from ..notebook.panel import Panel

    display(Panel(run))
