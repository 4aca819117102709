"""`watch()`: the context manager that ties a probe, detection and captures to one Run.

Data flows one way: the probe records a step into the trace, detection reads the new
steps when the scan schedule says so, captures are taken for what fired, listeners
(views) hear about it. The watch is what judges the run: the Run only reads what detection
found, so the watch scans as often as its listeners show the run (`ScanSchedule`), before
it stops the training (`stop_on`), and once more at the end of every block, after which
every recorded step is judged. Hooks are removed on every way out of the block: normal
exit, an exception, KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

import torch
from torch import nn

from ..detect.detection import (
    Detection,
    history_rows,
)
from ..detect.thresholds import Thresholds
from ..record.probe import Probe, StepRecord
from ..record.sampler import is_reference_step
from ..report.run import Run, TrainingFailure
from ..trace.columns import Trace
from . import notes
from .captures import EVENT, REFERENCE, CaptureStore
from .options import DEFAULT, LayerHooks, StopOn, WatchOptions, document
from .scans import ScanSchedule
from .selfcost import SelfCost

_last: Run | None = None


class Ended:
    """A run's recorder once its watch's block has ended (`Run.recorder`): what it did,
    without the probe, which holds the models: `ndbg.last_run()` keeps the last run,
    and through the probe it would keep a model the user let go of, with its memory."""

    attached = False

    def __init__(self, replays: int, replay_refused: str | None) -> None:
        self.replays = replays
        """Forwards replayed at anomalous steps (`Probe.replays`)."""
        self.replay_refused = replay_refused
        """Why a step's forward could not be replayed (`Probe.replay_refused`)."""

    def manual_step(self) -> None:
        raise RuntimeError(ENDED)

    def log_loss(self, value: float | torch.Tensor) -> None:
        raise RuntimeError(ENDED)

    def log_input(self, batch: object) -> None:
        raise RuntimeError(ENDED)

    def sum_losses(self) -> None:
        raise RuntimeError(ENDED)


ENDED = "the watch's block has ended: there is no step in progress to tell"


class Runs:
    """Every watch's Run in this process, numbered in the order they started:
    `ndbg.runs[i]` (what the panel's hints name, one per cell). Held weakly, so a run
    nobody keeps (no panel, no name) frees its captures; a view that re-classifies a run
    puts the new one under its number (`replace_last_run`)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Run]] = {}

    def add(self, run: Run) -> int:
        """`run`'s number, given it on first sight."""
        found = self.number(run)
        if found is not None:
            return found
        self._refs[len(self._refs)] = weakref.ref(run)
        return len(self._refs) - 1

    def number(self, run: Run) -> int | None:
        """`run`'s number, None if it is not here."""
        return next((i for i, ref in self._refs.items() if ref() is run), None)

    def replace(self, shown: Run, new: Run) -> None:
        i = self.number(shown)
        if i is not None:
            self._refs[i] = weakref.ref(new)

    def __getitem__(self, i: int) -> Run:
        """Run number `i` (negative: from the last). IndexError where there is no such
        number, LookupError where its run was freed."""
        ref = self._refs.get(i if i >= 0 else len(self._refs) + i)
        if ref is None:
            if not len(self):
                raise IndexError(f"no run {i}: no watch has started in this process yet "
                                 "(a saved run comes back with neuraldbg_nb.load(path))")
            raise IndexError(f"no run {i}: runs are numbered 0..{len(self) - 1} in the "
                             "order their watch started")
        run = ref()
        if run is None:
            raise LookupError(f"run {i} is no longer in memory: one that nothing holds "
                              "any more is freed")
        return run

    def __iter__(self) -> Iterator[Run]:
        """The runs still in memory, in the order their watch started."""
        return iter([run for ref in self._refs.values() if (run := ref()) is not None])

    def __len__(self) -> int:
        """Runs numbered so far, freed ones included."""
        return len(self._refs)

    def __repr__(self) -> str:
        alive = [i for i, ref in self._refs.items() if ref() is not None]
        return f"<neuraldbg runs {alive} of {len(self)} (ndbg.runs[i])>"


runs = Runs()


def last_run() -> Run | None:
    """The Run of the most recent watch (or `%%neuraldbg` cell) in this process, or what a
    view made of it (`replace_last_run`)."""
    return _last


def replace_last_run(shown: Run, new: Run) -> None:
    """Make `new` the last run where `shown` is: a view that re-classifies the run it shows
    (the panel's sliders) hands its new verdicts on, so that `last_run()` is the run on
    screen, with its selection (`run.selected`). A later watch's run is left as it is."""
    global _last
    if _last is shown:
        _last = new
    runs.replace(shown, new)


def _roots(model: Any) -> list[tuple[str, nn.Module]] | None:
    if model is None:
        return None
    if isinstance(model, nn.Module):
        return [("", model)]
    if isinstance(model, Mapping):
        items = list(model.items())
    elif isinstance(model, Iterable) and not isinstance(model, (str, bytes)):
        items = [(str(i), m) for i, m in enumerate(model)]
    else:
        items = [("", model)]
    for name, m in items:
        if not isinstance(m, nn.Module):
            raise TypeError(f"watch() takes a torch.nn.Module (or a list/dict of them); got "
                            f"{type(m).__name__} for {name or 'model'!r}. Pass the model "
                            f"itself, not its output or its parameters.")
    return [(f"{name}.", m) for name, m in items]


class Watch:
    """Re-enterable: a second `with` on the same Watch continues the same run."""

    warn_notes = True
    """Say each note of the run (`run.notes`) as a warning too, as it is made. The cell
    magic turns it off: it prints the notes itself when the cell ends, where a warning
    would show each one twice, pointing at the magic's own code."""

    def __init__(self, model: Any = None, *, thresholds: Thresholds | None = None,
                 stop_on: StopOn = DEFAULT.stop_on, capture_mb: float = DEFAULT.capture_mb,
                 sample_every: int = DEFAULT.sample_every,
                 overhead: float | None = DEFAULT.overhead,
                 activations: bool = DEFAULT.activations,
                 layer_hooks: LayerHooks = DEFAULT.layer_hooks,
                 trace_mb: float = DEFAULT.trace_mb,
                 report: bool | None = DEFAULT.report, **threshold_changes: Any) -> None:
        self.options = WatchOptions(  # checks them
            thresholds=(thresholds or Thresholds()).with_(**threshold_changes),
            stop_on=stop_on, capture_mb=capture_mb, sample_every=sample_every,
            overhead=overhead, activations=activations, layer_hooks=layer_hooks,
            trace_mb=trace_mb, report=report)
        th = self.options.thresholds
        self.trace_bytes = int(trace_mb * 2**20)
        self.stop_on = stop_on
        self.report = report
        trace = Trace(max_tail_bytes=self.trace_bytes)
        self._captures = CaptureStore(int(capture_mb * 2**20))
        self.run = Run(trace, th, self._captures, Detection(th))
        self._cost = self.run.cost = SelfCost(overhead)
        self._activations = activations
        self._probe = Probe(trace, _roots(model), sample_every=sample_every,
                            hold_refs=capture_mb > 0 and activations,
                            activations=activations, overhead=overhead,
                            hold_jump=th.wake_jump, cost=self._cost,
                            layer_hooks=layer_hooks,
                            on_step=self._on_step, on_error=self._on_error)
        self._active = False
        self._schedule = ScanSchedule(th, stops=stop_on == "error")
        self._seen = 0
        self._start_s = 0.0  # the engine's time in the open block's start (`__enter__`)

    def __enter__(self) -> Run:
        global _last
        if self._active:
            raise RuntimeError("this watch is already active; nest a new watch() instead")
        started = time.perf_counter()
        self._active = True
        self.run.status = "training"
        self.run.recorder = self._probe
        self.run.rank = _rank()  # asked again at exit: the group may be made in the block
        self._probe.attach()
        _last = self.run
        runs.add(self.run)
        self._cost.entered(started)
        self._start_s = time.perf_counter() - started
        return self.run

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        started, stepped = time.perf_counter(), self._cost.own_s
        run = self.run
        run.rank = run.rank or _rank()
        try:
            if self._probe.failed:
                pass  # nothing more to read from it: what it recorded is in the trace
            elif exc_type is None and self._probe.has_pending and self._probe.steps_seen == 0 \
                    and not self._probe.manual_steps and run.trace.n_steps == 0:
                self._probe.close_partial()
                scaled = run.trace.n_steps > 0 and not math.isnan(
                    float(run.trace.scalar("amp_scale", 0, 1)[0]))
                run.unstepped, why = notes.unstepped(self._probe.foreign_steps, scaled)
                self._note(why, f"neuraldbg: {why}", UserWarning)
            else:
                if exc_type is None:  # (an exception in flight stays the user's own)
                    self._probe.close_trailing()
                if not self._probe.failed:
                    self._probe.flush()
        finally:
            self._probe.detach()
            self._active = False
        probe = self._probe
        if probe.compiled_seen and not any("compile" in n for n in run.notes):
            run.notes.append(notes.COMPILED)
        if probe.transformed_seen and not any("torch.func" in n for n in run.notes):
            run.notes.append(notes.TRANSFORMED)
        if probe.zeroed_before_step and notes.ZEROED_BEFORE_STEP not in run.notes:
            run.notes.append(notes.ZEROED_BEFORE_STEP)
        if probe.eval_seen and self._activations and not probe.activations_seen \
                and notes.EVAL_ONLY not in run.notes:
            run.notes.append(notes.EVAL_ONLY)
        refused = probe.replay_refused
        if refused is not None:
            note = notes.replay_refused(refused)
            if note not in run.notes:
                run.notes.append(note)
        if not probe.failed:
            seen = notes.unseen(run.trace, self._activations and not probe.compiled_seen
                                and not probe.transformed_seen)
            if seen is not None and seen not in run.notes:
                run.notes.append(seen)
        if exc_type is None or issubclass(exc_type, GeneratorExit) or (
                issubclass(exc_type, SystemExit) and getattr(exc, "code", None) in (None, 0)):
            # `sys.exit(0)` ends a script as its last line does; a generator whose
            # consumer stopped early (`break` over it) is closed, not failed
            run.status = "finished"
        elif issubclass(exc_type, SystemExit):
            run.status = "exited"
            run.exception = exc
        elif issubclass(exc_type, TrainingFailure):
            run.status = "stopped"
        elif issubclass(exc_type, KeyboardInterrupt):
            run.status = "interrupted"
        else:
            run.status = "raised"
            run.exception = exc
        run.recorder = Ended(probe.replays, probe.replay_refused)
        try:  # (the engine's error is the run's note, never the user's program's end)
            self._scan()  # every recorded step judged; the schedule counts from here on
        except Exception as e:  # noqa: BLE001 - see `_on_error`
            self._on_error(e, "the end of the block")
        # the block's start and end (steps closed here were counted with their steps),
        # before the views are told, so that they show it
        self._cost.left(self._start_s + time.perf_counter() - started
                        - (self._cost.own_s - stepped))
        told = time.perf_counter()
        try:
            run.notify([])  # re-entry
        except Exception as e:  # noqa: BLE001 - see `_on_error`
            self._on_error(e, "the end of the block")
        self._cost.outside(time.perf_counter() - told)
        if self.report or (self.report is None and not _in_notebook()):
            try:  # (the story of what was recorded, the error's note in it)
                print(run, file=sys.stderr)
            except Exception as e:  # noqa: BLE001 - see `_on_error`
                self._on_error(e, "the end of the block")

    def charge(self, seconds: float) -> None:
        """Time spent for this run outside its blocks (the cell magic's panel, made
        before the block, and its diagnosis, after it): counted in what the whole run
        cost (`Overhead.whole`)."""
        self._cost.outside(seconds)

    def _on_step(self, record: StepRecord) -> None:
        run = self.run
        if self._schedule.due(run.trace, run.detection, viewed=run.listened):
            self._scan()
        new = run.detection.emitted[self._seen:]
        self._seen = len(run.detection.emitted)
        self._capture(record, new, self._schedule.woken)
        self._bound_trace()
        note = self._cost.budget_note(self._activations)
        if note is not None:
            self._note(note, f"neuraldbg: {note}")
        run.notify(new)
        if self.stop_on == "error" and any(e.severity == "error" for e in new):
            self._scan()  # its message names the first failure of every step recorded
            raise TrainingFailure(run)

    def _scan(self) -> None:
        """Judge every step recorded so far (`Detection.advance`), timed for the schedule."""
        started = time.perf_counter()
        self.run.detection.advance(self.run.trace)
        self._schedule.scanned(time.perf_counter() - started)

    def _on_error(self, exc: Exception, where: str) -> None:
        """A hook of the probe raised. `TrainingFailure` is the watch's own way out, and
        with NEURALDBG_STRICT=1 (the test suite) every error is raised again, with its
        traceback. Any other error is the engine's, not the training's: the run says so
        (a RuntimeWarning, `run.notes`) and the training goes on, unwatched from there."""
        if isinstance(exc, TrainingFailure) or os.environ.get("NEURALDBG_STRICT") == "1":
            raise exc
        note = notes.engine_error(self.run.trace.n_steps, where, exc)
        self._note(note, note)
        # the panel shows it now, with every recorded step judged: no step comes to push
        # it before the block ends; detection or a view failing too must not stop the
        # training
        with contextlib.suppress(Exception):
            self._scan()
        with contextlib.suppress(Exception):
            self.run.notify([])

    def _note(self, note: str, warning: str,
              category: type[Warning] = RuntimeWarning) -> None:
        """A note in `run.notes` (and `print(run)`, the panel), said once as a warning
        too (`warn_notes`), which must not stop the training where warnings are errors."""
        self.run.notes.append(note)
        if not self.warn_notes:
            return
        try:
            warnings.warn(warning, category, stacklevel=3)
        except category:
            pass  # -W error: the note is in run.notes

    def _bound_trace(self) -> None:
        """Keep the trace within 1.5 x `trace_mb`: when the exact tail outgrows `trace_mb`,
        its older half moves into the compacted history (once detection has read it),
        whose rows are held to half of `trace_mb`."""
        t = self.run.trace
        if t.over(self.trace_bytes):
            detection = self.run.detection
            detection.advance(t)  # detection reads the steps before they go
            t.fit(self.trace_bytes, detection.steps_done - history_rows(self.run.thresholds))

    def _capture(self, record: StepRecord, new: list, early: list[int]) -> None:
        """The tensors of the layers of the new events (and of every layer at a reference
        step), and of the layers in `early`, whose sampled condition starts here but is
        reported later (`SampledWake`)."""
        store = self._captures
        if store.budget == 0:
            return
        fired = {e.order for e in new if e.severity != "info" and e.order >= 0} | set(early)
        reference = is_reference_step(record.step)
        if fired or reference or any(e.severity != "info" for e in new):
            # the batch once per step, under layer None
            store.add(record.step, None, EVENT if new or early else REFERENCE,
                      {"batch": record.batch})
        layers = sorted(fired) + (sorted(record.refs) if reference else [])
        if not layers:
            return
        names = self.run.trace.layer_names
        owned: dict[int, list[tuple[str, nn.Parameter]]] = {}
        for name, p, owner in record.params:  # in one pass: a reference takes them all
            owned.setdefault(owner, []).append((name, p))
        shared: dict[tuple[object, int], torch.Tensor] = {}  # one copy of what layers share
        for idx in layers:
            if idx >= len(names) or store.has(record.step, names[idx]):
                continue
            inp, out = record.refs.get(idx, (None, None))
            tensors = {"input": inp, "output": out}
            first_grad = True
            for name, p in owned.get(idx, []):
                local = name[len(names[idx]) + 1:]
                tensors[local] = p
                tensors[f"{local}.grad"] = p.grad
                if first_grad and p.grad is not None:
                    tensors["grad"] = p.grad
                    first_grad = False
            store.add(record.step, names[idx], EVENT if idx in fired else REFERENCE, tensors,
                      shared)


def _rank() -> tuple[int, int] | None:
    """(rank, world size) in a distributed run of several processes, None otherwise: each
    process watches its own replica, and its story says which one it is (a rank's bad
    batch reaches every rank's gradients through the all-reduce, but only its own
    input and activations). From the process group where there is one, else from the
    variables that torchrun and other launchers set (`RANK`, `WORLD_SIZE`): a watch is
    often entered before the script makes its group (`neuraldbg run`)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        except (KeyError, ValueError):
            return None
    return (rank, world) if world > 1 else None


def _in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ip = shell.get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def watch(model: Any = None, *, thresholds: Thresholds | None = None,
          stop_on: StopOn = DEFAULT.stop_on, capture_mb: float = DEFAULT.capture_mb,
          sample_every: int = DEFAULT.sample_every, overhead: float | None = DEFAULT.overhead,
          activations: bool = DEFAULT.activations,
          layer_hooks: LayerHooks = DEFAULT.layer_hooks, trace_mb: float = DEFAULT.trace_mb,
          report: bool | None = DEFAULT.report, **threshold_changes: Any) -> Watch:
    """Watch a training loop: `with watch(model) as run: ...`.

    model: the module to watch (or a list/dict of them); None watches every module with
        parameters that runs inside the block.

    The options (declared in `live.options.WatchOptions`):
    """
    return Watch(model, thresholds=thresholds, stop_on=stop_on, capture_mb=capture_mb,
                 sample_every=sample_every, overhead=overhead, activations=activations,
                 layer_hooks=layer_hooks, trace_mb=trace_mb, report=report,
                 **threshold_changes)


watch.__doc__ = document(watch.__doc__ or "")
