"""Lightning: `NeuralDbgCallback` watches the LightningModule of `Trainer(callbacks=[...])`.

    from neuraldbg_nb.integrations.lightning import NeuralDbgCallback
    cb = NeuralDbgCallback(stop_on="error")
    Trainer(callbacks=[cb]).fit(model, loader)
    cb.run.first_failure

Every rank watches its own replica, also the ranks Lightning starts itself (its DDP
launchers run the callback in each process). Steps are the optimizer steps, as Lightning's
`global_step` counts them under gradient accumulation, clipping, mixed precision and
manual optimization. The first failure and the event counts go to the trainer's loggers;
the run is saved into the trainer's log folder; in a notebook the live panel shows.
Works with `lightning` (`lightning.pytorch`) and with the older `pytorch_lightning`.
"""

from __future__ import annotations

from typing import Any

from ..report.run import Run
from .framework import FrameworkWatch, event_text, show_panel

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    try:
        import pytorch_lightning as pl
    except ImportError as e:
        raise ImportError("neuraldbg_nb.integrations.lightning needs Lightning: "
                          "pip install lightning") from e


class NeuralDbgCallback(pl.Callback):
    """Watch each `fit` of the trainer; `**options` are `watch()`'s (`stop_on="error"`
    stops the fit through `trainer.should_stop` at the first error). The Run is `.run`."""

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self._fw = FrameworkWatch(options)

    @property
    def run(self) -> Run | None:
        """The Run of the latest `fit` (None before one starts)."""
        return self._fw.run

    @property
    def state_key(self) -> str:
        return "NeuralDbgCallback"

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        run = self._fw.start(pl_module)
        if trainer.is_global_zero:
            show_panel(run)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        # Lightning calls `training_step`, not the module's forward: the batch is given
        if self._fw.run is not None:
            self._fw.run.log_input(batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        new = self._fw.take_events()
        if new:
            _log_events(trainer, new, self._fw.summary())
        if self._fw.should_stop:
            trainer.should_stop = True

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer, None)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(trainer, exception)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._fw.active:  # a fit that ended without on_fit_end (e.g. a sanity check)
            self._finish(trainer, None)

    def _finish(self, trainer: Any, exc: BaseException | None) -> None:
        run = self._fw.stop(exc)
        if run is None:
            return
        _log_events(trainer, self._fw.take_events(), self._fw.summary(), final=run)
        self._fw.save_into(trainer.log_dir or trainer.default_root_dir)


def _log_events(trainer: Any, new: list, numbers: dict[str, float],
                final: Run | None = None) -> None:
    """The event counts as metrics of every logger, and the events (and at the end the
    first failure) as text where a logger takes text (TensorBoard's `add_text`,
    Weights & Biases' `log_text`)."""
    step = trainer.global_step
    for logger in trainer.loggers:
        if numbers:
            logger.log_metrics(numbers, step=step)
        experiment = getattr(logger, "experiment", None)
        add_text = getattr(experiment, "add_text", None)
        if callable(add_text):
            for e in new:
                add_text("neuraldbg/events", event_text(e), e.step)
            if final is not None and final.first_failure is not None:
                add_text("neuraldbg/first_failure", event_text(final.first_failure),
                         final.first_failure.step)
        elif final is not None and callable(getattr(logger, "log_text", None)):
            rows = [[e.step, e.severity, e.layer or "", e.message] for e in final.events]
            if rows:
                logger.log_text(key="neuraldbg/events",
                                columns=["step", "severity", "layer", "message"], data=rows)
