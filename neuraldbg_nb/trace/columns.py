"""The run's record: steps x layers numeric columns, appended once per step.

The trace is what detection reads, what is saved and loaded, and what the panel draws.
It holds numbers only (numpy) and knows nothing of hooks. Memory is bounded: the recent
steps are kept exactly (the *tail*, which detection reads); older steps can be compacted
into a *history* of blocks (the worst value of each block: maxima, the mean loss), which
views draw. Events found on the exact numbers are kept by detection, so compaction never
loses one; it only coarsens the healthy history behind them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

WEIGHT_PROBE = 4096
"""Elements of each weight tensor that `param_norm` and `update_ratio` are read from (the
first ones): the whole of a smaller tensor."""

EDIT_PROBE = 256
"""Elements of each weight tensor that `w_edited` is read from (the first ones of the
`WEIGHT_PROBE` slice): an edit outside the optimizer (a weight scaled, clipped, reset or
assigned) moves every part it touches, and reading it at every step costs a copy and a
pass of this many elements per weight instead of the whole slice."""

ZEROED = 2.0
"""`grads_missing` where a backward ran and every trained weight had a gradient at the
optimizer's step, each one exactly 0: zeroed in place or scaled to 0 between the
backward and the step (`zero_grad(set_to_none=False)` after `backward()`, clipping to a
norm of 0)."""

HOOK_GAP = 10
"""The steps whose layer hooks are on (`hooked`) are at most this many apart: a recording
promise that the activation baselines count on (`detect.regime.MEASURED_WARMUP`: a window
of 20 steps holds two measured steps). Sampled steps (every `sample_every`, 10 by default)
and reference steps are hooked; the recorder hooks a step of its own only where they are
further apart."""

LAYER_COLUMNS: tuple[str, ...] = (
    "grad_norm",      # norm of the layer's own parameter gradients (weight and bias together)
    "param_norm",     # norm of the layer's weights after this step's update (of the first
                      # WEIGHT_PROBE elements of each tensor: the exact norm of smaller layers)
    "update_ratio",   # |w_after - w_before| / |w_before| of this step's update (sampled;
                      # of the same slice as param_norm; inf where w_before was all zeros)
    "update_unmoved",  # fraction of the same slice that this step's update left exactly as
                       # it was (sampled; half-precision weights only)
    "act_absmax",     # max |output| (the steps whose layer hooks were on: `hooked`; inf when
                      # any output is non-finite)
    "act_mean",       # mean of the output (sampled; of an evenly strided sample of it where
                      # it is large: `record.reductions.SAMPLE`)
    "act_std",        # std of the output (sampled; as act_mean)
    "zero_frac",      # fraction of exact zeros in the output (sampled; as act_mean)
    "dead_frac",      # fraction of units zero for the whole batch, ReLU-like layers (sampled)
    "sat_frac",       # fraction of outputs at the bounds, bounded activations (sampled; as
                      # zero_frac)
    "act_nonfinite",  # count of non-finite outputs (sampled)
    "grad_unheld",    # >0: the layer's weights got gradients that no optimizer holds (every
                      # step; its values: `record.membership`), 0 where they are held
    "grad_cut",       # >0: the layer's weights are held by an optimizer but got no
                      # gradient in the step, trainable or frozen (every step; its values:
                      # `record.membership.Membership.cut`)
    "w_edited",       # |w_now - w_after_last_update| / |w_after_last_update| as the step's
                      # update begins, of the first EDIT_PROBE elements of param_norm's
                      # slice: how far the weights moved outside the optimizer before the
                      # step's forward (every step from the second on, NaN where the last
                      # update left them non-finite; `record.weights.WeightProbe.queue`)
)
"""Per layer-step columns. NaN means "not measured at this step"."""

STEP_COLUMNS: tuple[str, ...] = (
    "loss", "lr",
    "in_absmax", "in_mean", "in_std", "in_zero_frac", "in_nonfinite", "in_const", "in_repeat",
    "in_reiter",  # >0: the step's batches came from a DataLoader iterator made in the step
                  # and dropped before its epoch ended (`next(iter(loader))`): the loader's
                  # batches in an epoch (`record.loaders`)
    "in_epoch_start",  # 1: the step's batch was the first of a DataLoader iterator that
                       # lives on (an epoch began; `record.loaders`); NaN: no DataLoader
    "amp_scale_from", "amp_scale",  # the GradScaler's loss scale at the step's first and
                                    # last scaled backward (`record.amp_scale.ScaleTrail`)
    "sampled",
    "hooked",  # 1: the layers' forward hooks ran in the step's forward, or it was replayed
               # (`record.replay`): its activation columns are measured; 0: they are not
               # (NaN, in files written before it: read as 1)
    "eval_layers",  # dropout/BatchNorm layers of a model in eval mode as the backward
                    # starts (0: training mode; see `record.discovery.Models.layers_in_eval`)
    "grad_carried",  # 1: the step's gradients still held the last step's (no zero_grad;
                     # see `record.carried.CarryCheck`;
                     # `REAPPLIED`: the last step's, applied again)
    "grads_missing",  # 1: a backward ran, but no weight had a gradient at the optimizer's
                      # step (see `record.optimizer.missing_gradients`); ZEROED: every
                      # weight had one, and all of them were exactly 0
    "opt_fresh",  # 1: an optimizer that keeps state between steps made its first step in
                  # the step, with none yet (one made anew; `record.membership`), 0: none did
    "others_carried",  # `grad_carried` for the other optimizers that stepped since the last
                       # boundary (a GAN's second), the worst of them
                       # (`record.carried.OtherCarries`)
    "loss_squashed",  # sampled: the loss applies its own squashing to an output already
                      # squashed or bounded (`record.loss_form`: SOFTMAX_TWICE,
                      # SIGMOID_TWICE, BOUNDED_LOGITS; 0: not)
    "loss_broadcast",  # sampled: how many targets each prediction of a regression loss
                       # meets, broadcast against a target of another shape (0: none)
    "loss_chance",  # sampled: ln(C) where the loss is a mean cross-entropy over C classes
                    # (`record.loss_form.chance`; NaN: another loss)
    "label_top",  # sampled, where the loss is a mean cross-entropy of one class label per
                  # sample (not per pixel): the class most of the step's labels are
    "label_share",  # sampled: the share of the step's labels that `label_top` has (1: all)
    "label_n",  # sampled: the step's labels counted (`ignore_index` left out)
    "label_classes",  # sampled: C, the classes the loss is over
)
"""Per step scalars: the loss, the learning rate, the watched model's input batch, the
models' mode, the gradients' zeroing."""

SOFTMAX_TWICE = 1.0
"""`loss_squashed`: a log-softmax (cross-entropy's) of a softmax's output."""
SIGMOID_TWICE = 2.0
"""`loss_squashed`: `binary_cross_entropy_with_logits` of a sigmoid's output."""
BOUNDED_LOGITS = {3.0: "ReLU", 4.0: "sigmoid", 5.0: "tanh"}
"""`loss_squashed`: a log-softmax of the output of one of these activations (logits that
cannot go below 0, or beyond their bounds)."""

REAPPLIED = 2.0
"""The `grad_carried` value of a step that heard no backward and whose gradients are the
very ones the last step applied, untouched: `optimizer.step()` called twice."""

UNHELD = 1.0
"""`grad_unheld` of a layer whose weights with a gradient no optimizer holds
(`record.membership`)."""
REPLACED = 2.0
"""`grad_unheld` of such a layer where an optimizer that trains the watched models also
holds weights they no longer have: the layer was replaced after the optimizer was built."""
UNTRAINED_MODEL = 3.0
"""`grad_unheld` of a layer of a watched model none of whose weights any optimizer holds (a
perceptual-loss network or a teacher left trainable): its gradients are computed for
nothing, but no training is broken."""

CUT = 1.0
"""`grad_cut` of a layer held by an optimizer and trainable that got no gradient at the
step while a layer after it in its model did: its output reaches the loss only through a
`.detach()` (or not at all)."""
MODEL_CUT = 2.0
"""`grad_cut` of such a layer where no layer of its model got a gradient (a generator
trained on `fake.detach()`)."""
UNUSED = 3.0
"""`grad_cut` of such a layer where a layer before it in its model got a gradient: an
output the loss does not use (a pooler, a head trained in turn)."""
FROZEN = 4.0
"""`grad_cut` of a layer held by an optimizer whose weights are all frozen
(`requires_grad` off): it cannot train, by design (a frozen backbone handed to the
optimizer with the rest) or by mistake."""
DETACHED = 5.0
"""`grad_cut` of a layer that would be `UNUSED` but whose output changes the model's
output (`record.replay.Replay.reaches`): it enters it only detached (a residual branch
added as `h + block(h).detach()`), so its weights never train."""

ROLES = ("relu", "bounded", "other")
"""Layer roles that make activation rules type-aware: dead units only mean something
after ReLU-like layers, saturation only after bounded activations."""


@dataclass(frozen=True)
class LayerInfo:
    name: str
    type: str
    role: str
    has_params: bool
    primary_lr: bool = True
    """The step's `lr` is its learning rate: its weights are not trained by another
    optimizer than the one that marks the steps (a GAN's generator is)."""
    params: int = -1
    """Elements in its own parameters (-1: not recorded, a run saved before they were)."""
    outputs: int = -1
    """The fewest elements one of its calls output (-1: not recorded)."""
    since: int = 0
    """The step from which its numbers are of the module that has its name now: a layer
    the loop replaced inside the watch (`model.fc = nn.Linear(...)`) keeps the name's
    column, and its own history starts there (`detect.regime`)."""

    @property
    def label(self) -> str:
        """The layer in a sentence: its name and type."""
        return f"{self.name} ({self.type})" if self.type else self.name


class Trace:
    """Columnar store: an exact tail of recent steps and a compacted history before it.

    Step coordinates everywhere: `col(name, start, stop)` reads exact steps of the tail
    (`full_from` onwards); `history(name)` reads every recorded step, compacted blocks
    included, for views.
    """

    MAX_HISTORY = 4096
    """History rows at most; past it, adjacent blocks merge (each then covers twice the
    steps), so any run length fits in a fixed number of rows."""

    def __init__(self, max_tail_bytes: int | None = None) -> None:
        """`max_tail_bytes`: the most the exact tail will be allowed to hold before its
        owner compacts it (watch's `trace_mb`); the tail's arrays, which grow by doubling,
        are never allocated much beyond it."""
        self.max_tail_bytes = max_tail_bytes
        self.layers: list[LayerInfo] = []
        self._index: dict[str, int] = {}
        self._cap = 64
        self._rows = 0
        self._off = 0
        self._width = 0  # layers the arrays below have columns for (`_widen`)
        self._tail_layer = {c: self._blank(self._cap, 0) for c in LAYER_COLUMNS}
        self._step_cols = {c: np.full(self._cap, np.nan, np.float64) for c in STEP_COLUMNS}
        self._h_steps = np.zeros(0, np.int64)
        self._hist_layer = {c: self._blank(0, 0) for c in LAYER_COLUMNS}
        self._h_step = {c: np.zeros(0) for c in STEP_COLUMNS}
        self._first_grads = np.zeros(0, np.float32)
        self._first_loss = math.nan
        self._version = 0
        self._row_nbytes = (-1, 0)  # (layers, bytes of a row then): `row_nbytes`
        self.ended = False
        """The run's last update is in the last row (its weight norms, written as the
        watch ends: `record.weights`), with no step after it to judge it: detection judges
        it as that step would (`detect.last_update`). A step appended after it (the block
        entered again) takes that role, and this is False again."""

    @staticmethod
    def _blank(steps: int, layers: int) -> np.ndarray:
        return np.full((steps, layers), np.nan, np.float32)

    # -- layers ---------------------------------------------------------------------
    def add_layer(self, name: str, type_: str = "", role: str = "other",
                  has_params: bool = False, primary_lr: bool = True,
                  params: int = -1) -> int:
        """Register a layer (idempotent by name); returns its column index, which is also
        its forward execution order."""
        if name in self._index:
            return self._index[name]
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.layers.append(LayerInfo(name, type_, role, has_params, primary_lr, params))
        self._version += 1
        self._index[name] = len(self.layers) - 1
        return self._index[name]

    def _widen(self) -> None:
        """Give the layer arrays a column for each layer added since they were last read
        (`add_layer` only names it): a model's layers are found one by one in its first
        forward, and widening every array for each would copy them once per layer (about
        6 ms for 120 layers)."""
        n = len(self.layers)
        if self._width == n:
            return
        for cols in (self._tail_layer, self._hist_layer):
            for c, a in cols.items():
                grown = self._blank(a.shape[0], n)
                grown[:, : a.shape[1]] = a
                cols[c] = grown
        grads = np.full(n, np.nan, np.float32)
        grads[: self._width] = self._first_grads
        self._first_grads = grads
        self._width = n

    @property
    def _layer_cols(self) -> dict[str, np.ndarray]:
        """The exact tail's layer columns, (rows, layers) each."""
        self._widen()
        return self._tail_layer

    @property
    def _h_layer(self) -> dict[str, np.ndarray]:
        """The compacted history's layer columns, (rows, layers) each."""
        self._widen()
        return self._hist_layer

    @_h_layer.setter
    def _h_layer(self, cols: dict[str, np.ndarray]) -> None:
        self._widen()
        self._hist_layer = cols

    @property
    def _first_grad(self) -> np.ndarray:
        """Each layer's gradient norm at step 0."""
        self._widen()
        return self._first_grads

    def update_layer(self, index: int, **changes: Any) -> None:
        """What the run learned of layer `index` after adding it (`LayerInfo`'s fields:
        that another optimizer trains it, that its output is the model's)."""
        info = replace(self.layers[index], **changes)
        if info != self.layers[index]:
            self.layers[index] = info
            self._version += 1

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
        """Steps recorded in all (compacted ones included)."""
        return self._off + self._rows

    @property
    def full_from(self) -> int:
        """First step still held exactly (0 unless the trace was compacted)."""
        return self._off

    @property
    def first_grad_norm(self) -> np.ndarray:
        """Each layer's gradient norm at the run's first step (NaN for layers first seen
        later): the scale the run's gradients started at, kept when the steps around it
        are compacted (`detectors.gradients.explode_line`)."""
        return self._first_grad

    @property
    def first_loss(self) -> float:
        """The run's first finite loss: where it started, kept when the steps around it
        are compacted (`detectors.loss`)."""
        return self._first_loss

    @property
    def version(self) -> int:
        """Counts the changes to the recorded numbers (a step appended or filled in late, a
        layer added, a compaction): what is derived from the trace at one version holds
        while the version does. Writing into the arrays that `col` returns is not counted."""
        return self._version

    # -- rows -----------------------------------------------------------------------
    def append(self, layer_values: dict[str, np.ndarray], scalars: dict[str, float]) -> int:
        """Add one step; columns not given stay NaN. Returns the step index."""
        if self._rows == self._cap:
            self._grow()
        r = self._rows
        for c, v in layer_values.items():
            self._layer_cols[c][r, : len(v)] = v
        if self._off + r == 0 and "grad_norm" in layer_values:
            g = layer_values["grad_norm"]
            self._first_grad[: len(g)] = g
        for name, x in scalars.items():
            self._step_cols[name][r] = x
        if math.isnan(self._first_loss) and math.isfinite(scalars.get("loss", math.nan)):
            self._first_loss = float(scalars["loss"])
        self._rows += 1
        self._version += 1
        self.ended = False
        return self._off + r

    def set_layer_values(self, column: str, step: int, values: np.ndarray) -> None:
        """Fill a column of an already recorded step (values known one step late, such as
        the update ratio of a step's optimizer update). NaN entries are left alone."""
        if not self._off <= step < self.n_steps:
            raise IndexError(f"step {step} is not in the exact tail "
                             f"[{self._off}, {self.n_steps})")
        row = self._layer_cols[column][step - self._off]
        np.copyto(row[: len(values)], values, where=~np.isnan(values))
        self._version += 1

    def _grow(self) -> None:
        cap = 2 * self._cap
        if self.max_tail_bytes is not None and self.row_nbytes > 0:
            cap = min(cap, self.max_tail_bytes // self.row_nbytes + 2)
        self._cap = max(cap, self._rows + 1)
        for c, a in self._layer_cols.items():
            grown = self._blank(self._cap, a.shape[1])
            grown[: self._rows] = a[: self._rows]
            self._layer_cols[c] = grown
        for c, a in self._step_cols.items():
            g = np.full(self._cap, np.nan, np.float64)
            g[: self._rows] = a[: self._rows]
            self._step_cols[c] = g

    # -- compaction -----------------------------------------------------------------
    def compact(self, upto: int, block: int | None = None, max_rows: int | None = None) -> None:
        """Move the exact steps before `upto` into the history, `block` steps a row
        (default: the history's current block size), merging adjacent history rows while
        there are more than `max_rows` (default `MAX_HISTORY`). Steps in the history can no
        longer be re-classified; their events stay with the detection that found them."""
        upto = min(upto, self.n_steps)
        m = upto - self._off
        if m <= 0:
            return
        block = block or self.block
        starts = np.arange(0, m, block)
        h_layer = {c: np.fmax.reduceat(a[:m], starts, axis=0) for c, a in self._layer_cols.items()}
        h_step = {c: np.fmax.reduceat(a[:m], starts) for c, a in self._step_cols.items()}
        loss = self._step_cols["loss"][:m]
        ok = np.isfinite(loss)
        sums = np.add.reduceat(np.where(ok, loss, 0.0), starts)
        counts = np.add.reduceat(ok.astype(np.float64), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            h_step["loss"] = np.where(counts > 0, sums / counts, h_step["loss"])
        self._h_steps = np.concatenate([self._h_steps, self._off + starts])
        for c in LAYER_COLUMNS:
            self._h_layer[c] = np.concatenate([self._h_layer[c], h_layer[c]])
        for c in STEP_COLUMNS:
            self._h_step[c] = np.concatenate([self._h_step[c], h_step[c]])
        for cols in (self._layer_cols, self._step_cols):
            for a in cols.values():
                a[: self._rows - m] = a[m : self._rows]
                a[self._rows - m : self._rows] = np.nan
        self._rows -= m
        self._off = upto
        self._version += 1
        while len(self._h_steps) > (max_rows or self.MAX_HISTORY):
            self._merge_history()

    def over(self, max_bytes: int) -> bool:
        """Whether the exact tail has outgrown `max_bytes`."""
        return self.tail_nbytes > max_bytes

    def fit(self, max_bytes: int, upto: int) -> None:
        """Hold the trace to 1.5 x `max_bytes`: the older half of the exact tail (no step
        at or after `upto`, which the caller still needs exactly) moves into the history,
        whose rows are held to half of `max_bytes`."""
        keep = max_bytes // 2 // self.row_nbytes
        self.compact(min(self.n_steps - keep, upto),
                     max_rows=max(64, max_bytes // 2 // self.row_nbytes))

    @property
    def block(self) -> int:
        """Steps per history row (8 until the history fills, then doubling)."""
        if len(self._h_steps) < 2:
            return 8
        return int(np.max(np.diff(self._h_steps)))

    def _merge_history(self) -> None:
        pairs = np.arange(0, len(self._h_steps), 2)
        self._h_steps = self._h_steps[pairs]
        for c, a in self._h_layer.items():
            self._h_layer[c] = np.fmax.reduceat(a, pairs, axis=0)
        for c, a in self._h_step.items():
            self._h_step[c] = np.fmax.reduceat(a, pairs)

    # -- reading --------------------------------------------------------------------
    def _span(self, start: int | None, stop: int | None) -> slice:
        start = self._off if start is None else start
        stop = self.n_steps if stop is None else stop
        if start < self._off:
            raise ValueError(f"steps before {self._off} were compacted into the history; "
                             f"read them with trace.history(name)")
        return slice(start - self._off, stop - self._off)

    def col(self, name: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
        """A (steps x layers) view of a per-layer column, exact steps [start, stop) of the
        tail (default: all of it)."""
        if name not in self._layer_cols:
            raise KeyError(f"no layer column {name!r}; columns: {', '.join(LAYER_COLUMNS)}")
        return self._layer_cols[name][self._span(start, stop)]

    def scalar(self, name: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
        """A (steps,) view of a per-step column of the tail."""
        if name not in self._step_cols:
            raise KeyError(f"no step column {name!r}; columns: {', '.join(STEP_COLUMNS)}")
        return self._step_cols[name][self._span(start, stop)]

    def history(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(first step of each row, values) over the whole run: the compacted blocks, then
        the exact tail. Rows are sorted by step; views bucket them by step."""
        steps = np.concatenate([self._h_steps, np.arange(self._off, self.n_steps)])
        if name in self._layer_cols:
            return steps, np.concatenate([self._h_layer[name], self.col(name)])
        if name in self._step_cols:
            return steps, np.concatenate([self._h_step[name], self.scalar(name)])
        raise KeyError(f"no column {name!r}")

    @property
    def roles(self) -> np.ndarray:
        return np.array([info.role for info in self.layers], dtype=object)

    @property
    def row_nbytes(self) -> int:
        """Bytes of one step (one row) of the trace: worked out again only when a layer
        was added (the watch asks at every step)."""
        n = len(self.layers)
        if self._row_nbytes[0] != n:
            per_row = sum(a.itemsize * a.shape[1] for a in self._layer_cols.values())
            self._row_nbytes = (n, per_row + sum(a.itemsize for a in self._step_cols.values()))
        return self._row_nbytes[1]

    @property
    def tail_nbytes(self) -> int:
        """Bytes of the exact tail's recorded steps."""
        return self.row_nbytes * self._rows

    @property
    def allocated_nbytes(self) -> int:
        """Bytes the trace's arrays take, the tail's spare capacity included."""
        tail = sum(a.nbytes for a in self._layer_cols.values())
        tail += sum(a.nbytes for a in self._step_cols.values())
        history = sum(a.nbytes for a in self._h_layer.values())
        history += sum(a.nbytes for a in self._h_step.values())
        return tail + history + self._h_steps.nbytes

    @property
    def nbytes(self) -> int:
        """Bytes held for the recorded steps (tail and history; not spare capacity)."""
        return self.row_nbytes * (self._rows + len(self._h_steps)) + self._h_steps.nbytes

    def to_dataframe(self) -> pd.DataFrame:
        """Long format: one row per (step, layer) with the step's scalars repeated;
        compacted history rows carry the first step of their block."""
        import pandas as pd

        steps, _ = self.history("loss")
        n = len(steps)
        data: dict[str, Any] = {
            "step": np.repeat(steps, self.n_layers),
            "layer": np.tile(np.array(self.layer_names, dtype=object), n),
        }
        for c in LAYER_COLUMNS:
            data[c] = self.history(c)[1].reshape(-1)
        for c in STEP_COLUMNS:
            data[c] = np.repeat(self.history(c)[1], self.n_layers)
        return pd.DataFrame(data)

    # -- files ----------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        arrays = {f"layer__{c}": self.col(c) for c in LAYER_COLUMNS}
        arrays.update({f"step__{c}": self.scalar(c) for c in STEP_COLUMNS})
        arrays.update({f"hlayer__{c}": a for c, a in self._h_layer.items()})
        arrays.update({f"hstep__{c}": a for c, a in self._h_step.items()})
        meta = np.array([[i.name, i.type, i.role, str(int(i.has_params)), str(int(i.primary_lr)),
                          str(i.params), str(i.outputs), str(i.since)] for i in self.layers],
                        dtype=str).reshape(-1, 8)
        arrays.update(layers=meta, h_steps=self._h_steps, offset=np.array([self._off]),
                      first_grad_norm=self._first_grad, first_loss=np.array([self._first_loss]),
                      ended=np.array([self.ended]))
        np.savez_compressed(path, allow_pickle=False, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        with np.load(path, allow_pickle=False) as z:
            t = cls()
            for i, (name, type_, role, has_params, *rest) in enumerate(z["layers"]):
                t.add_layer(str(name), str(type_), str(role), has_params == "1",
                            rest[:1] != ["0"], int(rest[1]) if len(rest) > 1 else -1)
                if len(rest) > 2:  # files of 4 to 6 columns were saved before `outputs`
                    t.update_layer(i, outputs=int(rest[2]))
                if len(rest) > 3:  # and of 7 before `since`
                    t.update_layer(i, since=int(rest[3]))
            n = len(z["step__loss"])
            while t._cap < n:
                t._grow()
            for c in LAYER_COLUMNS:  # a column newer than the file stays NaN (not measured)
                if f"layer__{c}" in z:
                    t._layer_cols[c][:n] = z[f"layer__{c}"]
            for c in STEP_COLUMNS:
                if f"step__{c}" in z:
                    t._step_cols[c][:n] = z[f"step__{c}"]
            t._rows = n
            t._version += 1
            if "h_steps" in z:
                t._off = int(z["offset"][0])
                t._h_steps = z["h_steps"]
                t._h_layer = {c: z[f"hlayer__{c}"] if f"hlayer__{c}" in z else
                              t._blank(len(t._h_steps), len(t.layers)) for c in LAYER_COLUMNS}
                t._h_step = {c: z[f"hstep__{c}"] if f"hstep__{c}" in z else
                             np.full(len(t._h_steps), np.nan) for c in STEP_COLUMNS}
            if "first_grad_norm" in z:
                t._first_grad[:] = z["first_grad_norm"]
            elif t._off == 0 and n:  # an older file: its first step is still exact
                t._first_grad[:] = t._layer_cols["grad_norm"][0]
            t.ended = bool(z["ended"][0]) if "ended" in z else False
            if "first_loss" in z:
                t._first_loss = float(z["first_loss"][0])
            elif t._off == 0:  # an older file whose first steps are still exact
                finite = t._step_cols["loss"][:n][np.isfinite(t._step_cols["loss"][:n])]
                t._first_loss = float(finite[0]) if len(finite) else math.nan
        return t
