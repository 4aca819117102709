"""The semantic events that detection emits: what views and users read."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any


class Kind(str, enum.Enum):
    """Event kinds. A `str` subclass, so `event.kind == "regime_shift"` holds."""

    VANISHING_GRADIENT = "vanishing_gradient"
    EXPLODING_GRADIENT = "exploding_gradient"
    NONFINITE_GRADIENT = "nonfinite_gradient"
    NONFINITE_ACTIVATION = "nonfinite_activation"
    DEAD_UNITS = "dead_units"
    SATURATION = "saturation"
    REGIME_SHIFT = "regime_shift"
    EXPLODING_UPDATE = "exploding_update"
    WEIGHTS_NOT_UPDATED = "weights_not_updated"
    DATA_ANOMALY = "data_anomaly"
    LOSS_NONFINITE = "loss_nonfinite"
    LOSS_DIVERGENCE = "loss_divergence"
    LOSS_MISUSE = "loss_misuse"
    LOSS_AT_CHANCE = "loss_at_chance"
    LR_CHANGE = "lr_change"
    EVAL_MODE = "eval_mode"
    GRADS_NOT_ZEROED = "grads_not_zeroed"
    NO_GRADIENTS = "no_gradients"
    STEP_REPEATED = "step_repeated"
    NOT_IN_OPTIMIZER = "not_in_optimizer"
    CUT_OFF = "cut_off"
    OPTIMIZER_REMADE = "optimizer_remade"
    RECOVERY = "recovery"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Event:
    """One transition in the run: a layer (or the data, or the loss) changed state.

    `step` is the 0-based optimizer step; `layer` the qualified module name, or None for
    events of the data or the loss. `value` is the number that crossed the line and
    `previous` the level it came from (last healthy value, or the recent baseline for a
    jump). `end` is the step the state ended, or None while it lasts.
    """

    step: int
    layer: str | None
    kind: str
    severity: str
    message: str
    value: float = float("nan")
    previous: float = float("nan")
    signal: str = ""
    end: int | None = None
    order: int = -1
    """Forward execution order of the layer (-1 for the data and the loss)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return f"[{self.severity}] step {self.step}: {self.message}"
