"""Detection settings: one frozen value that every detector reads.

Thresholds are data, not code: the live run, a reloaded run and the panel's sliders all
re-run the same pure detectors with a `Thresholds` value, so changing one never needs
training again.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """What counts as unhealthy. Defaults are the classic heuristics, tuned to stay quiet
    on healthy training."""

    vanish: float = 1e-6
    """Gradient norm of a layer's own parameters below which its gradient has vanished."""
    explode: float = 1e3
    """Gradient norm above which a layer's gradient has exploded; scaled up for a run
    whose gradients start above 100 (`detectors.gradients.explode_line`)."""
    jump: float = 10.0
    """Factor against the layer's own recent history (in log space) that counts as a regime
    shift worth a warning."""
    jump_error: float = 100.0
    """Factor that makes an activation or input regime shift an error."""
    window: int = 20
    """Steps of recent history that a regime shift is measured against."""
    warmup: int = 5
    """Steps of history needed before a regime shift can be judged at all."""
    noise: float = 4.0
    """A jump must also exceed this many standard deviations of the series' own recent
    variation (in log space): a layer that always swings by a decade is not flagged."""
    dead: float = 0.5
    """Fraction of a ReLU-like layer's units that output zero for the whole batch; an error
    from 0.9 or the larger of this and 0.9."""
    saturated: float = 0.5
    """Fraction of a bounded activation's outputs pinned at its bounds."""
    unmoved: float = 0.9
    """Fraction of a half-precision layer's weights that an update leaves exactly as they
    were (its updates round away: the layer stops learning); it ends below 0.8 of this."""
    max_update: float = 1.0
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
    lookback: int = 10
    """Steps before the first error that the root-cause search looks back for an earlier
    jump or data anomaly that started the chain."""

    def __post_init__(self) -> None:
        for name in ("vanish", "explode", "jump", "jump_error", "loss_rise", "max_update",
                     "noise"):
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
        for name in ("window", "warmup", "patience", "trend"):
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
