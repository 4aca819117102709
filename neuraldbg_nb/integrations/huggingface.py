"""Hugging Face transformers: `NeuralDbgCallback` watches the model of a `Trainer`.

    from neuraldbg_nb.integrations.huggingface import NeuralDbgCallback
    cb = NeuralDbgCallback(stop_on="error")
    Trainer(model=model, args=args, train_dataset=data, callbacks=[cb]).train()
    cb.run.first_failure

Steps are the Trainer's optimizer steps (`state.global_step`), gradient accumulation
included. New events go into the Trainer's logs (`neuraldbg/errors`, `neuraldbg/warnings`,
`neuraldbg/first_failure_step` and the first failure's sentence), so every `report_to`
backend records them; `stop_on="error"` ends training through
`control.should_training_stop`; the run is saved in `args.output_dir`; in a notebook the
live panel shows. Each process of a distributed run (torchrun, accelerate launch) watches
its own replica.
"""

from __future__ import annotations

import functools
import gc
from typing import Any

from ..report.run import Run
from .framework import FrameworkWatch, event_text, show_panel

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise ImportError("neuraldbg_nb.integrations.huggingface needs transformers: "
                      "pip install transformers") from e


class NeuralDbgCallback(TrainerCallback):
    """Watch each `train()` of the Trainer; `**options` are `watch()`'s
    (`stop_on="error"` stops training at the first error). The Run is `.run`."""

    def __init__(self, **options: Any) -> None:
        self._fw = FrameworkWatch(options)
        self._pending: list[str] = []

    @property
    def run(self) -> Run | None:
        """The Run of the latest `train()` (None before one starts)."""
        return self._fw.run

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _close_on_error(self, state)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        if model is None:
            raise ValueError("NeuralDbgCallback: the Trainer passed no model to watch")
        _log_before_reporters(self, state)
        _close_on_error(self, state)  # (a callback added after the Trainer was made)
        run = self._fw.start(model)
        if state.is_world_process_zero:
            show_panel(run)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        new = self._fw.take_events()
        self._pending.extend(event_text(e) for e in new if e.severity != "info")
        if self._fw.should_stop:
            control.should_training_stop = True
            control.should_log = True  # the loggers hear why training stopped

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs is None or self._fw.run is None:
            return
        logs.update(self._fw.summary())
        if self._pending:
            logs["neuraldbg/events"] = "\n".join(self._pending)
            self._pending = []
        root = self._fw.run.first_failure
        if root is not None:
            logs["neuraldbg/first_failure"] = event_text(root)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._fw.stop(None)
        self._fw.save_into(args.output_dir)

    def _raised(self, exc: BaseException, output_dir: str | None) -> None:
        """`train()` raised (`_close_on_error`): the watch ends with the exception (its
        hooks removed, the run's status "raised" or "interrupted") and the run is saved."""
        if self._fw.active:
            self._fw.stop(exc)
            self._fw.save_into(output_dir)


def _trainer_dict(state: Any) -> dict[str, Any] | None:
    """The `__dict__` of the Trainer that holds `state` (a callback is not told its
    Trainer), or None."""
    for holder in gc.get_referrers(state):
        if isinstance(holder, dict) and holder.get("state") is state \
                and "callback_handler" in holder:
            return holder
    return None


def _close_on_error(callback: NeuralDbgCallback, state: Any) -> None:
    """Make the Trainer's `train()` end the watch where it raises: transformers tells a
    callback of no exception (`on_train_end` comes only after a training that ended), and
    the model's hooks would stay, recording its later calls into the run. Its `train` is
    wrapped on the instance, once (`_EndsWatchOnError`): from the Trainer's next `train()`
    where the callback was added after the Trainer was made."""
    holder = _trainer_dict(state)
    train = None if holder is None else holder.get("train")
    if holder is None or (isinstance(train, _EndsWatchOnError) and train.callback is callback):
        return
    trainer = next((o for o in gc.get_referrers(holder)
                    if getattr(o, "__dict__", None) is holder), None)
    if trainer is not None:
        holder["train"] = _EndsWatchOnError(trainer, callback)


class _EndsWatchOnError:
    """A Trainer's `train`, which ends `callback`'s watch where it raises. Pickled (a
    Trainer copied to another process) as the Trainer's own method: no watch goes with
    it."""

    def __init__(self, trainer: Any, callback: NeuralDbgCallback) -> None:
        self.trainer = trainer
        self.callback = callback
        functools.update_wrapper(self, type(trainer).train)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return type(self.trainer).train(self.trainer, *args, **kwargs)
        except BaseException as exc:
            self.callback._raised(exc, getattr(self.trainer.args, "output_dir", None))
            raise

    def __reduce__(self) -> tuple[Any, ...]:
        return _own_train, (self.trainer,)


def _own_train(trainer: Any) -> Any:
    return type(trainer).train.__get__(trainer)


def _log_before_reporters(callback: NeuralDbgCallback, state: Any) -> None:
    """Move `callback` ahead of the reporting callbacks in its Trainer's list, so that the
    numbers its `on_log` adds reach every `report_to` backend: the Trainer calls its
    callbacks in order with one `logs` dict, and puts the ones a user gives after its own
    reporters. A callback is not told its Trainer: it is found as the holder of `state`.
    Where it is not found, the events reach the loggers that come after this callback
    only (the Trainer writes `state.log_history` before any callback's `on_log`, so the
    events are never in it)."""
    holder = _trainer_dict(state)
    callbacks = getattr(holder.get("callback_handler"), "callbacks", None) if holder else None
    if not isinstance(callbacks, list) or callback not in callbacks:
        return
    callbacks.remove(callback)
    first = 1 if callbacks and type(callbacks[0]).__name__ == "DefaultFlowCallback" else 0
    callbacks.insert(first, callback)
