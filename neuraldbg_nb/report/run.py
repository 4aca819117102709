"""A Run: the record of one watched training (trace, events, captures) and what a user asks
of it. It reads; it never hooks, trains or judges: its events are what its detection found
(a live run's watch scans as it trains and judges every step when its block ends)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..detect.causes import Cause, likely_causes
from ..detect.detection import (
    BaselineCache,
    Detection,
    StateMap,
    first_failure,
    keep_baselines,
    symptoms,
)
from ..detect.events import Event
from ..detect.thresholds import Thresholds
from ..trace.columns import Trace
from . import story
from .captures import Captures
from .overhead import CostSource, Overhead

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from .captures import Capture

STATUS_TEXT = {
    "training": "is running",
    "finished": "finished",
    "stopped": "was stopped at the first failure",
    "raised": "raised an exception",
    "exited": "ended with a non-zero exit code (sys.exit)",
    "interrupted": "was interrupted",
}


class Recorder(Protocol):
    """What a live run's `step()` and `log_loss()` talk to: the recorder of the watch
    whose block runs (`record.probe.Probe`)."""

    @property
    def attached(self) -> bool:
        """Its hooks are installed: the watch's block is running."""
        ...

    def manual_step(self) -> None:
        """End the step in progress."""
        ...

    def log_loss(self, value: float | torch.Tensor) -> None:
        """The step's loss, given by hand."""
        ...

    def log_input(self, batch: object) -> None:
        """The step's input batch, given by hand."""
        ...

    def sum_losses(self) -> None:
        """A step's loss is the sum of its backwards' losses."""
        ...


class TrainingFailure(RuntimeError):
    """Raised by `watch(..., stop_on="error")` at the first error; carries the run."""

    def __init__(self, run: Run) -> None:
        self.run = run
        root = run.first_failure
        text = root.message if root is not None else "an error event"
        super().__init__(f"training stopped at step {run.trace.n_steps - 1}: {text}. "
                         f"Inspect it with run.inspect(run.first_failure) "
                         f"(the run is this exception's .run, or neuraldbg_nb.last_run()).")


class Run:
    """Everything recorded about one watched training."""

    def __init__(self, trace: Trace, thresholds: Thresholds, captures: Captures,
                 detection: Detection | None = None) -> None:
        """`detection`: what judges `trace`, step by step as it grows (a live run's, fed by
        its watch). None: the trace is recorded already, and judged whole here."""
        self.trace = trace
        self.thresholds = thresholds
        self.captures = captures
        self.detection = detection or Detection(thresholds)
        self.status = "training"
        self.exception: BaseException | None = None
        self.selected: Capture | None = None
        """The capture last opened by `inspect` or a click in the panel."""
        self.notes: list[str] = []
        """Plain-language notes about what could not be watched (compiled code, ...)."""
        self.rank: tuple[int, int] | None = None
        """(rank, world size) of the process that recorded a distributed run of several
        processes, None otherwise."""
        self.unstepped: str | None = None
        """Why a live run recorded its whole block as one step, where no optimizer step
        of the watched model was seen (the story's headline says it; a note says more)."""
        self.recorder: Recorder | None = None
        """The watch's recorder (set by the watch): what `step()` and `log_loss()` call
        while its block runs."""
        self.cost: CostSource | None = None
        """The engine's own time per step, measured while training (None when loaded)."""
        self._saved_cost: Overhead | None = None  # a loaded run's, as it was saved
        self.loaded_from: Path | None = None
        """The file a loaded run came from (`load`); None for a live run."""
        self._listeners: list[Callable[[Run, list[Event]], None]] = []
        self._baselines = BaselineCache()
        """What re-classifying this trace computes once (the trailing baselines), shared
        with the runs re-classified from this one; empty until the first `reclassify` or
        `prepare_reclassify`."""
        if detection is None:
            self.detection.advance(trace)

    # -- results ----------------------------------------------------------------------
    @property
    def events(self) -> list[Event]:
        """Semantic events on transitions, in step order, as far as the run is judged:
        every recorded step once a watch's block has ended (while it runs, up to its last
        scan: `live.scans.ScanSchedule`)."""
        return self.detection.events

    @property
    def first_failure(self) -> Event | None:
        """The root cause: the event that started the first failure."""
        return first_failure(self.events, self.thresholds)

    @property
    def likely_causes(self) -> list[Cause]:
        """What probably made the first failure happen there (a learning rate moved, its
        layer's weights changed outside the optimizer): `detect.causes`. Empty for a
        healthy run."""
        return likely_causes(self.events, self.first_failure, self.thresholds, self.trace)

    @property
    def symptoms(self) -> list[Event]:
        """Warnings and errors that followed the first failure."""
        return symptoms(self.events, self.first_failure)

    @property
    def states(self) -> StateMap:
        """Each layer's state at each step (the health map)."""
        return StateMap(self.events, self.trace.n_steps, self.trace.n_layers)

    @property
    def overhead(self) -> Overhead | None:
        """What watching cost over the recent steps, measured as it trained: the engine's
        time per step and its share of the loop's step (an estimate from inside: see
        `selfcost`). A loaded run gives what it was when saved; None before a few steps."""
        return self.cost.summary() if self.cost is not None else self._saved_cost

    @property
    def status_text(self) -> str:
        return STATUS_TEXT.get(self.status, self.status)

    def reclassify(self, thresholds: Thresholds | None = None, **changes: Any) -> Run:
        """The same recorded run judged under other thresholds, without training again.

        Gives exactly the events a live run with those thresholds would have given. On a
        very long run whose oldest steps were compacted (`trace.full_from > 0`), those steps
        keep the events found live and only the exact tail is judged again.
        `run.reclassify(vanish=1e-5)` changes one setting of the current thresholds.
        The trailing baselines of the trace are computed once and kept (`BaselineCache`)
        until the trace changes, so moving a slider again re-grades them.
        """
        th = (thresholds or self.thresholds).with_(**changes)
        start = self.trace.full_from  # compacted steps keep the events found live
        kept = [e for e in self.events if e.step < start]
        other = Run(self.trace, th, self.captures,
                    Detection(th, start, kept, baselines=self._baselines))
        other._baselines = self._baselines
        other.detection.advance(self.trace)
        other.status, other.exception, other.notes = self.status, self.exception, self.notes
        other.unstepped, other.rank = self.unstepped, self.rank
        other.cost, other._saved_cost = self.cost, self._saved_cost
        other.loaded_from = self.loaded_from
        other.selected = self.selected
        return other

    def prepare_reclassify(self) -> None:
        """Compute now what re-classifying this run needs whatever the slider thresholds
        (the trailing baselines, kept until the trace changes), so that the first
        `reclassify` is as fast as the next. The panel calls it when training ends."""
        keep_baselines(self.trace, self.thresholds, self._baselines)

    # -- inspection -------------------------------------------------------------------
    def inspect(self, event: Event | str | None = None, step: int | None = None) -> Capture:
        """The tensors captured for an event (or a layer name and step), by name:
        `run.inspect(run.first_failure)["output"]`. Where nothing was captured at that
        step, the nearest capture of the layer, with a note saying so."""
        if event is None:
            event = self.first_failure
            if event is None:
                raise LookupError("this run has no failure to inspect; pass an event or a "
                                  "layer name and a step")
        if isinstance(event, Event):
            layer, step = event.layer, event.step
        else:
            layer = event
            if step is None:
                raise TypeError("inspect(layer_name, step): give the step too")
            if layer not in self.trace.layer_names:
                import difflib
                hint = difflib.get_close_matches(layer, self.trace.layer_names, n=1)
                raise KeyError(f"no layer {layer!r} in this run"
                               + (f"; did you mean {hint[0]!r}?" if hint else ""))
        found = self.captures.find(step, layer)
        if found is not None and layer is not None:
            batch = self.captures.find(found.step, None)
            if batch is not None and batch.step == found.step and "batch" in batch.tensors:
                found = replace(found, tensors={**found.tensors, "batch": batch["batch"]})
        if found is None and self.loaded_from is not None:
            raise LookupError(
                f"this run was loaded from {self.loaded_from}, and captured tensors are not "
                f"saved with a run (the trace and the events are): inspect the live run, "
                f"e.g. neuraldbg_nb.last_run() in the session that trained it")
        if found is None:
            budget = self.captures.budget / 2**20
            raise LookupError(
                f"nothing was captured for {layer or 'the batch'} in this run (capture "
                f"budget {budget:.3g} MB, {self.captures.dropped} captures dropped); raise it "
                f"with watch(..., capture_mb=N) or %%neuraldbg --capture-mb N")
        self.selected = found
        return found

    def last_healthy(self, capture: Capture) -> Capture | None:
        """The reference capture of the same layer before `capture` (for comparison)."""
        return self.captures.last_healthy(capture.step, capture.layer)

    # -- live runs --------------------------------------------------------------------
    def step(self) -> None:
        """Mark the end of a training step, in loops without an optimizer."""
        if self.recorder is None or not self.recorder.attached:
            raise RuntimeError("run.step() is for use inside the `with watch(...)` block")
        self.recorder.manual_step()

    def log_loss(self, value: Any) -> None:
        """Record this step's loss where it is not the tensor `backward()` is called on
        (e.g. a scaled AMP loss, or a loss computed elsewhere)."""
        if self.recorder is None or not self.recorder.attached:
            raise RuntimeError("run.log_loss() is for use inside the `with watch(...)` block")
        self.recorder.log_loss(value)

    def log_input(self, batch: Any) -> None:
        """Record this step's input batch (a tensor, or a tuple/dict whose first floating
        tensor is the input) where the watched model is not called with it: a training
        step that calls the model's submodules (a framework's `training_step`). The
        model's own calls in the step then record no other batch."""
        if self.recorder is None or not self.recorder.attached:
            raise RuntimeError("run.log_input() is for use inside the `with watch(...)` block")
        self.recorder.log_input(batch)

    def sum_losses(self) -> None:
        """Record a step's loss as the sum of the losses its backwards were called on, not
        their mean: for loops that scale each micro-batch's loss by 1 / (micro-batches per
        step) for gradient accumulation, as Lightning, transformers and accelerate
        (`accelerator.backward`) do; the sum is then the loss they log. The framework
        callbacks call it; with a single backward per step both are the same."""
        if self.recorder is None or not self.recorder.attached:
            raise RuntimeError("run.sum_losses() is for use inside the `with watch(...)` block")
        self.recorder.sum_losses()

    def subscribe(self, listener: Callable[[Run, list[Event]], None]) -> Callable[[], None]:
        """Call `listener(run, new_events)` after every recorded step; returns an
        unsubscribe function. Views use it to update live: while one listens, the watch
        judges the run at a view's pace, so what they read of it is at most
        `live.scans.ScanSchedule.view_latency` late (a second at most)."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    @property
    def listened(self) -> bool:
        """Whether a listener follows the run (`subscribe`): its watch then scans at a
        view's pace (`live.scans.ScanSchedule.view_latency`)."""
        return bool(self._listeners)

    def notify(self, new: list[Event]) -> None:
        """Call every listener with `new`, the events found since the last call (the live
        watch calls it after each recorded step, and when its block ends)."""
        for listener in list(self._listeners):
            listener(self, new)

    # -- export -----------------------------------------------------------------------
    def to_dataframe(self) -> pd.DataFrame:
        """The trace in long format, one row per (step, layer)."""
        return self.trace.to_dataframe()

    def to_tensorboard(self, writer: Any, grad_norms: bool = False) -> Path | None:
        """The events in TensorBoard, as text at their steps with the first failure
        marked, and running error/warning counts; with `grad_norms`, each layer's
        gradient norm as a scalar per step. `writer`: a `SummaryWriter` or a log folder
        (see `report.tensorboard.to_tensorboard`)."""
        from .tensorboard import to_tensorboard

        return to_tensorboard(self, writer, grad_norms=grad_norms)

    def to_wandb(self, wandb_run: Any = None, grad_norms: bool = False) -> None:
        """The events in Weights & Biases (`wandb_run`, or the current `wandb.run`): a
        table of every event, the first failure in the run's summary, and with
        `grad_norms` each layer's gradient norm per step (see `report.wandb`)."""
        from .wandb import to_wandb

        to_wandb(self, wandb_run, grad_norms=grad_norms)

    def save(self, path: str | Path) -> Path:
        """Save the trace, the events and the settings (not the captured tensors) to a
        .npz file and a .json beside it; reload with `neuraldbg_nb.load(path)` and
        re-classify freely. The events are saved because the trace alone cannot give them
        back where a long run's older steps were compacted (`trace.full_from > 0`): those
        were found on exact numbers that are no longer kept."""
        path, meta_path = saved_files(path)
        self.trace.save(path)
        cost = self.overhead
        meta = {"thresholds": self.thresholds.as_dict(), "status": self.status,
                "notes": self.notes, "unstepped": self.unstepped, "rank": self.rank,
                "events": [e.to_dict() for e in self.events],
                "overhead": asdict(cost) if cost is not None else None}
        meta_path.write_text(json.dumps(_strict(meta), indent=1, allow_nan=False))
        return path

    def to_html(self, path: str | Path) -> Path:
        """Write the run's report as one self-contained HTML file (`report.page`: no
        network, opens from disk): the header, the loss and health map, the first failure
        and its likely causes, the events, and the numbers of each captured step (a live
        run's; a loaded run has no captured tensors)."""
        from .page import write

        return write(self, path)

    def __str__(self) -> str:
        return story.tell(self)

    def __repr__(self) -> str:
        return (f"<neuraldbg Run: {self.trace.n_steps} steps, {self.trace.n_layers} layers, "
                f"{len(self.events)} events, status={self.status!r}>")


SAVE_HINT = "save one with run.save(path), or `neuraldbg run --save RUN.npz script.py`"


def saved_files(path: str | Path) -> tuple[Path, Path]:
    """The two files of the run saved as `path` (`Run.save`): the trace, `path` where it
    ends in .npz and else `path` with .npz added (a name's own dots are kept:
    `run_lr0.01` and `run_lr0.001` are two runs), and the .json beside it. The .json's
    own path names the same run."""
    path = Path(path)
    if path.suffix == ".json":
        path = path.with_suffix("")
    npz = path if path.suffix == ".npz" else path.with_name(path.name + ".npz")
    return npz, npz.with_suffix(".json")


def load(path: str | Path) -> Run:
    """A run saved with `Run.save`, ready to re-classify or show: its events as they were
    found while it trained. A file saved without its events is judged again from its
    exact steps, here. A path with no saved run raises FileNotFoundError, a file that is
    not one (another tool's, cut short) ValueError, each saying which file and why."""
    npz, meta_path = saved_files(path)
    if not npz.is_file():
        given = Path(path)
        if given.is_file() and given != npz and given != meta_path:  # (notes.txt: no run)
            raise ValueError(f"{given} is not a run saved by neuraldbg_nb (a saved run is a "
                             f".npz file, with a .json beside it): {SAVE_HINT}")
        where = f"{npz} is a directory" if npz.is_dir() else f"no saved run at {npz}"
        raise FileNotFoundError(f"{where}: {SAVE_HINT}")
    try:
        trace = Trace.load(npz)
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    except Exception as e:
        raise ValueError(f"{npz} is not a run saved by neuraldbg_nb, or was cut short "
                         f"({type(e).__name__}: {e}); {SAVE_HINT}") from e
    th = Thresholds(**_numbers(meta.get("thresholds", {}), Thresholds().as_dict()))
    saved = meta.get("events")
    if saved is None:
        detection = Detection(th)
        detection.advance(trace)
    else:
        detection = Detection(th, trace.n_steps,
                              [Event(**_numbers(e, ("value", "previous"))) for e in saved])
    run = Run(trace, th, Captures(0), detection)
    run.status = meta.get("status", "finished")
    run.notes = list(meta.get("notes", []))
    run.unstepped = meta.get("unstepped")
    rank = meta.get("rank")
    run.rank = (int(rank[0]), int(rank[1])) if rank else None
    if meta.get("overhead"):
        run._saved_cost = Overhead(**meta["overhead"])  # finite numbers only
    run.loaded_from = npz
    return run


def _strict(x: Any) -> Any:
    """`x` with its non-finite floats as the strings "nan", "inf" and "-inf": strict JSON
    has no NaN, and a saved run is read by other tools too (`_numbers` reads them back)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_strict(v) for v in x]
    return x


def _numbers(d: dict[str, Any], keys: Any) -> dict[str, Any]:
    """`d` with the values of `keys` that `_strict` wrote as strings made floats again."""
    return {k: float(v) if k in keys and isinstance(v, str) else v for k, v in d.items()}
