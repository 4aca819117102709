"""The run's record: steps x layers numeric columns, appended once per step.

The trace is what detection reads, what is saved and loaded, and what the panel draws.
It holds numbers only (numpy), a few bytes per layer-step, and knows nothing of hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

LAYER_COLUMNS: tuple[str, ...] = (
    "grad_norm",      # norm of the layer's own parameter gradients (weight and bias together)
    "param_norm",     # norm of the layer's own parameters, before this step's update
    "update_ratio",   # |w_after - w_before| / |w_before| of this step's update (sampled)
    "act_absmax",     # max |output| (every step; inf when any output is non-finite)
    "act_mean",       # mean of the output (sampled)
    "act_std",        # std of the output (sampled)
    "zero_frac",      # fraction of exact zeros in the output (sampled)
    "dead_frac",      # fraction of units zero for the whole batch, ReLU-like layers (sampled)
    "sat_frac",       # fraction of outputs at the bounds, bounded activations (sampled)
    "act_nonfinite",  # count of non-finite outputs (sampled)
)
"""Per layer-step columns. NaN means "not measured at this step"."""

STEP_COLUMNS: tuple[str, ...] = (
    "loss", "lr",
    "in_absmax", "in_mean", "in_std", "in_zero_frac", "in_nonfinite", "in_const", "in_repeat",
    "sampled",
)
"""Per step scalars: the loss, the learning rate, the watched model's input batch."""

ROLES = ("relu", "bounded", "other")
"""Layer roles that make activation rules type-aware: dead units only mean something
after ReLU-like layers, saturation only after bounded activations."""


@dataclass(frozen=True)
class LayerInfo:
    name: str
    type: str
    role: str
    has_params: bool


class Trace:
    """Growable columnar store. Appending is O(layers); memory ~40 bytes per layer-step."""

    def __init__(self) -> None:
        self.layers: list[LayerInfo] = []
        self._index: dict[str, int] = {}
        self._cap = 64
        self._n = 0
        self._layer_cols = {c: self._blank(self._cap, 0) for c in LAYER_COLUMNS}
        self._step_cols = {c: np.full(self._cap, np.nan, np.float64) for c in STEP_COLUMNS}

    @staticmethod
    def _blank(steps: int, layers: int) -> np.ndarray:
        return np.full((steps, layers), np.nan, np.float32)

    # -- layers ---------------------------------------------------------------------
    def add_layer(self, name: str, type_: str = "", role: str = "other",
                  has_params: bool = False) -> int:
        """Register a layer (idempotent by name); returns its column index, which is also
        its forward execution order."""
        if name in self._index:
            return self._index[name]
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.layers.append(LayerInfo(name, type_, role, has_params))
        self._index[name] = len(self.layers) - 1
        for c, a in self._layer_cols.items():
            grown = self._blank(self._cap, len(self.layers))
            grown[:, : a.shape[1]] = a
            self._layer_cols[c] = grown
        return self._index[name]

    def layer_index(self, name: str) -> int:
        return self._index[name]

    @property
    def layer_names(self) -> list[str]:
        return [info.name for info in self.layers]

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_steps(self) -> int:
        return self._n

    # -- rows -----------------------------------------------------------------------
    def append(self, layer_values: dict[str, np.ndarray], scalars: dict[str, float]) -> int:
        """Add one step; columns not given stay NaN. Returns the step index."""
        if self._n == self._cap:
            self._grow()
        s = self._n
        for c, v in layer_values.items():
            self._layer_cols[c][s, : len(v)] = v
        for c, v in scalars.items():
            self._step_cols[c][s] = v
        self._n += 1
        return s

    def set_layer_values(self, column: str, step: int, values: np.ndarray) -> None:
        """Fill a column of an already recorded step (values known one step late, such as
        the update ratio of a step's optimizer update). NaN entries are left alone."""
        if not 0 <= step < self._n:
            raise IndexError(f"step {step} not recorded (have {self._n})")
        row = self._layer_cols[column][step]
        keep = ~np.isnan(values)
        row[: len(values)][keep] = values[keep]

    def _grow(self) -> None:
        self._cap *= 2
        for c, a in self._layer_cols.items():
            grown = self._blank(self._cap, a.shape[1])
            grown[: self._n] = a[: self._n]
            self._layer_cols[c] = grown
        for c, a in self._step_cols.items():
            g = np.full(self._cap, np.nan, np.float64)
            g[: self._n] = a[: self._n]
            self._step_cols[c] = g

    # -- reading --------------------------------------------------------------------
    def col(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """A (steps x layers) view of a per-layer column."""
        if name not in self._layer_cols:
            raise KeyError(f"no layer column {name!r}; columns: {', '.join(LAYER_COLUMNS)}")
        return self._layer_cols[name][start : self._n if stop is None else stop]

    def scalar(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """A (steps,) view of a per-step column."""
        if name not in self._step_cols:
            raise KeyError(f"no step column {name!r}; columns: {', '.join(STEP_COLUMNS)}")
        return self._step_cols[name][start : self._n if stop is None else stop]

    @property
    def roles(self) -> np.ndarray:
        return np.array([info.role for info in self.layers], dtype=object)

    @property
    def nbytes(self) -> int:
        """Bytes used by the recorded steps (not the spare capacity)."""
        per_step = sum(a.itemsize * a.shape[1] for a in self._layer_cols.values())
        per_step += sum(a.itemsize for a in self._step_cols.values())
        return per_step * self._n

    def to_dataframe(self) -> pd.DataFrame:
        """Long format: one row per (step, layer), with the step's scalars repeated."""
        import pandas as pd

        steps = np.repeat(np.arange(self._n), self.n_layers)
        data: dict[str, Any] = {
            "step": steps,
            "layer": np.tile(np.array(self.layer_names, dtype=object), self._n),
        }
        for c in LAYER_COLUMNS:
            data[c] = self.col(c).reshape(-1)
        for c in STEP_COLUMNS:
            data[c] = np.repeat(self.scalar(c), self.n_layers)
        return pd.DataFrame(data)

    # -- files ----------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        arrays = {f"layer__{c}": self.col(c) for c in LAYER_COLUMNS}
        arrays.update({f"step__{c}": self.scalar(c) for c in STEP_COLUMNS})
        meta = np.array([[i.name, i.type, i.role, str(int(i.has_params))] for i in self.layers],
                        dtype=str).reshape(-1, 4)
        np.savez_compressed(path, layers=meta, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        with np.load(path, allow_pickle=False) as z:
            t = cls()
            for name, type_, role, has_params in z["layers"]:
                t.add_layer(str(name), str(type_), str(role), has_params == "1")
            n = len(z["step__loss"])
            while t._cap < n:
                t._grow()
            for c in LAYER_COLUMNS:
                t._layer_cols[c][:n] = z[f"layer__{c}"]
            for c in STEP_COLUMNS:
                t._step_cols[c][:n] = z[f"step__{c}"]
            t._n = n
        return t
