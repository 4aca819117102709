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

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        if model is None:
            raise ValueError("NeuralDbgCallback: the Trainer passed no model to watch")
        _log_before_reporters(self, state)
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


def _log_before_reporters(callback: NeuralDbgCallback, state: Any) -> None:
    """Move `callback` ahead of the reporting callbacks in its Trainer's list, so that the
    numbers its `on_log` adds reach every `report_to` backend: the Trainer calls its
    callbacks in order with one `logs` dict, and puts the ones a user gives after its own
    reporters. A callback is not told its Trainer: it is found as the holder of `state`.
    Where it is not found, the events still reach the Trainer's log history and the
    loggers that come after this callback."""
    for holder in gc.get_referrers(state):
        handler = holder.get("callback_handler") if isinstance(holder, dict) else None
        callbacks = getattr(handler, "callbacks", None)
        if not isinstance(callbacks, list) or callback not in callbacks:
            continue
        callbacks.remove(callback)
        first = 1 if callbacks and type(callbacks[0]).__name__ == "DefaultFlowCallback" else 0
        callbacks.insert(first, callback)
        return
