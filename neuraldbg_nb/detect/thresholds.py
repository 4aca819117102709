"""Detection settings: one frozen value that every detector reads.

Thresholds are data, not code: the live run, a reloaded run and the panel's sliders all
re-run the same pure detectors with a `Thresholds` value, so changing one never needs
training again.

Each setting's default, type and meaning (the docstring under its field) are written here
only; `settings()` describes them for what offers them to a user: the `%%neuraldbg` and
`neuraldbg` options, the panel's sliders (the span a setting's `_span` gives) and
docs/thresholds.md (`thresholds_doc`).
"""

from __future__ import annotations

import difflib
import math
import numbers
import typing
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .fielddocs import field_docs


def _span(lo: float, hi: float, *, log: bool = False) -> dict[str, Any]:
    """A field's metadata: the values worth trying, from `lo` to `hi` (on a log scale
    where `log`): the span of its slider in the panel."""
    return {"span": (lo, hi), "log": log}


@dataclass(frozen=True)
class Thresholds:
    """What counts as unhealthy. Defaults are the classic heuristics, tuned to stay quiet
    on healthy training."""

    vanish: float = field(default=1e-6, metadata=_span(1e-10, 1e-2, log=True))
    """Gradient norm of a layer's own parameters below which its gradient has vanished."""
    explode: float = field(default=1e3, metadata=_span(1.0, 1e8, log=True))
    """Gradient norm above which a layer's gradient has exploded; scaled up for a run
    whose gradients start above 100 (`detect.gradients.explode_line`)."""
    jump: float = field(default=10.0, metadata=_span(2.0, 1000.0, log=True))
    """Factor against the layer's own recent history (in log space) that counts as a regime
    shift worth a warning."""
    jump_error: float = 100.0
    """Factor that makes an activation or input regime shift an error."""
    raw_input: float = 100.0
    """Abs-max of the first step's input batch, and of the first layer's output, at or above
    which the inputs are raw, not normalised (pixel values 0-255, features of order 1000):
    a warning at step 0 that names the cause of the failure it leads to
    (`detect.raw_inputs`)."""
    window: int = 20
    """Steps of recent history that a regime shift is measured against."""
    warmup: int = 5
    """Steps of history needed before a regime shift can be judged at all."""
    noise: float = 4.0
    """A jump must also exceed this many standard deviations of the series' own recent
    variation (in log space): a layer that always swings by a decade is not flagged."""
    dead: float = field(default=0.5, metadata=_span(0.1, 1.0))
    """Fraction of a ReLU-like layer's units that output zero for the whole batch: a
    warning, and an error from the larger of this and 0.9 (`detect.activations.DEAD_ERROR`)."""
    saturated: float = field(default=0.5, metadata=_span(0.1, 1.0))
    """Fraction of a bounded activation's outputs pinned at its bounds."""
    unmoved: float = 0.9
    """Fraction of a half-precision layer's weights that an update leaves exactly as they
    were (its updates round away: the layer stops learning); it ends below 0.8 of this."""
    max_update: float = field(default=1.0, metadata=_span(0.01, 100.0, log=True))
    """Relative change of a layer's weight norm in one optimizer step that counts as an
    exploding update (1.0: the norm doubled, or fell to zero)."""
    loss_rise: float = 10.0
    """Factor above the recent loss level that counts as divergence (a jump against the
    last `window` steps, or a climb of the recent level over `trend` steps)."""
    trend: int = 200
    """Steps over which a slow climb of the loss is measured."""
    patience: int = 3
    """Steps a slow condition (vanishing, dead units, saturation) must hold before it is
    reported, and steps of health before a recovery is reported. Non-finite values and
    jumps are reported at once."""
    eval_steps: int = 50
    """Steps in a row a model trained in eval mode (dropout off, BatchNorm on running
    statistics) must keep at it before the warning becomes an error, dated from its first
    step: an evaluation that forgot `model.train()` is one, a short stretch is not."""
    chance_steps: int = 100
    """Steps in a row a cross-entropy loss must stay at or above chance, the loss of
    predicting each class by its frequency (ln(C) for C balanced classes; within
    `loss_form.CHANCE_MARGIN`), before it is a warning; twice as many make
    it an error: the model learns nothing from its inputs (labels shuffled apart from
    them, batches sorted by class, gradients clipped to nothing). A hard task's slow
    start leaves chance within it."""
    cut_steps: int = 8
    """Steps in a row that a layer which runs, is trainable and is held by an optimizer must
    get no gradient at all before it is cut off from the loss (an error, dated from the
    first): a head trained in turn gets one within its turn."""
    lookback: int = 10
    """Steps before the first error that the root-cause search looks back for an earlier
    jump or data anomaly that started the chain; a learning-rate move within them is named
    as a likely cause (`detect.causes`)."""

    def __post_init__(self) -> None:
        for f, kind in _KINDS.items():  # numbers of the field's kind: a count is whole
            object.__setattr__(self, f, _as_kind(f, getattr(self, f), kind))
        for name in ("vanish", "explode", "jump", "jump_error", "loss_rise", "max_update",
                     "noise", "raw_input"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Thresholds.{name} must be > 0, got {getattr(self, name)!r}")
        if self.vanish >= self.explode:
            raise ValueError(
                f"Thresholds.vanish ({self.vanish:g}) must be below explode ({self.explode:g})"
            )
        for name in ("dead", "saturated", "unmoved"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"Thresholds.{name} is a fraction in (0, 1], got "
                                 f"{getattr(self, name)!r}")
        for name in ("window", "warmup", "patience", "trend", "cut_steps", "eval_steps",
                     "chance_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"Thresholds.{name} must be >= 1, got {getattr(self, name)!r}")

    @property
    def wake_jump(self) -> float:
        """The move (a factor, either way) that makes a number worth a closer look at once:
        half the regime-shift jump in decades. The live scan wakes on it (`wake`), and the
        probe holds a large CPU activation for capture on it. (The wake test only decides
        when detection runs, never what it finds.)"""
        return math.sqrt(self.jump)

    def with_(self, **changes: Any) -> Thresholds:
        """A copy with some fields changed; unknown names get a spelling hint."""
        known = {f.name for f in fields(self)}
        for name in changes:
            if name not in known:
                hint = difflib.get_close_matches(name, known, n=1)
                extra = f" Did you mean {hint[0]!r}?" if hint else ""
                raise TypeError(f"Thresholds has no setting {name!r}.{extra} "
                                f"Known: {', '.join(sorted(known))}")
        return replace(self, **changes)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _as_kind(name: str, value: Any, kind: type) -> float:
    """`value` as a number of `kind` (`float` or `int`): a whole float (20.0, as a slider or
    a config file gives it) is a count; anything else that is not a number of that kind is
    refused with what to give instead."""
    if isinstance(value, bool) or not isinstance(value, (int, float, numbers.Real)):
        raise TypeError(f"Thresholds.{name} is a number ({kind.__name__}), got {value!r}")
    if kind is int:
        if isinstance(value, numbers.Integral):
            return int(value)
        if math.isfinite(value) and float(value).is_integer():
            return int(float(value))
        raise ValueError(f"Thresholds.{name} is a whole number (a count); "
                         f"got {value!r}")
    return float(value)


_KINDS: dict[str, type] = {name: kind for name, kind in
                           typing.get_type_hints(Thresholds).items() if kind in (int, float)}
"""Each setting's kind of number."""


def number(x: float) -> str:
    """A setting's value as a person writes it: 1e-6, 1e8, 0.5, 20."""
    text = f"{x:g}"
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if e else text


@dataclass(frozen=True)
class Setting:
    """One field of `Thresholds`, described for the views that offer it."""

    name: str
    type: type
    """`float` or `int`."""
    default: float
    doc: str
    """The docstring under the field, as one paragraph."""
    span: tuple[float, float] | None
    """The values worth trying (the panel's slider); None for a setting with no slider."""
    log: bool
    """Whether the span is on a log scale."""

    @property
    def option(self) -> str:
        """Its command-line option: `--jump-error` for `jump_error`."""
        return "--" + self.name.replace("_", "-")


def settings() -> tuple[Setting, ...]:
    """Every field of `Thresholds`, in declaration order."""
    hints = typing.get_type_hints(Thresholds)
    docs = field_docs(Thresholds)
    defaults = Thresholds()
    return tuple(Setting(f.name, hints[f.name], getattr(defaults, f.name), docs.get(f.name, ""),
                         f.metadata.get("span"), bool(f.metadata.get("log", False)))
                 for f in fields(Thresholds))
