"""The input batch: which tensor is the data, its summary, and its fingerprint (is this
batch the last one again?).

The batch is the first tensor of each top-level call of a watched model that trains
(`Inputs.record`). Every step: min, max (a free non-finite flag), sum and a
position-weighted sum; sampled steps add the norm and the nonzero and finite counts. They
are queued on the step's `reductions.Scalars`; `step_row.input_scalars` reads them back
into the row. Whether the step's batches came from a DataLoader iterator made anew in the
step is `loaders`' to tell.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

from . import reductions, step_row
from .layers import first_tensor, storage_at
from .loaders import LoaderIterators

if TYPE_CHECKING:
    from .discovery import Models


def _scattered(n: int) -> torch.Tensor:
    """n weights in [0, 1) without pattern, in float64: frac(sin(i) x 43758.5453), a hash
    used for noise in shaders. Without random numbers (the user's generator is never
    touched). Weights with a pattern let batches cancel out: with frac(i x golden ratio)
    the difference of two one-hot rows depends on their states only, not on the row, and
    batches of one-hot states collided as with weights 0, 1, 2, ..."""
    return torch.frac(torch.sin(torch.arange(1, n + 1, dtype=torch.float64)) * 43758.5453).abs()


class Ramps:
    """The weights of the input fingerprint's weighted sum (`input_batch`, `_scattered`), one
    vector per batch size (up to `RAMP_MAX`), dtype and device, the last two kept (a data
    set's last batch is smaller). A weighted sum tells apart batches that a sum does not:
    two one-hot vectors always have the same min, max and sum. Weights in a pattern do not
    either: a strided sum (every third element) misses hot positions that differ by a
    multiple of 3, and weights 0, 1, 2, ... any two batches whose hot positions add up
    alike (a batch of 16 one-hot states out of 6 would "repeat" the one before 7 times in
    300 steps)."""

    KEEP = 2

    def __init__(self) -> None:
        self._kept: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}

    def like(self, flat: torch.Tensor) -> torch.Tensor:
        """The weights for `flat` (at most `RAMP_MAX` of them); for a batch of up to
        `ONE_OP_MAX` elements, the rows of ones and weights (`_sums`)."""
        key = (flat.numel(), flat.dtype, flat.device)
        ramp = self._kept.get(key)
        if ramp is None:
            if len(self._kept) >= self.KEEP:
                self._kept.pop(next(iter(self._kept)))
            ramp = _scattered(key[0]).to(device=key[2], dtype=key[1])
            if key[0] <= ONE_OP_MAX:
                ramp = torch.stack([torch.ones_like(ramp), ramp])
            self._kept[key] = ramp
        return ramp

    def release(self) -> None:
        self._kept.clear()


def input_batch(x: torch.Tensor, rich: bool, into: reductions.Scalars, ramps: Ramps) -> dict[str, int]:
    """Positions of a batch's summaries. Every step: min, max (a free non-finite flag),
    sum and a position-weighted sum (`Ramps`; with min and max, a fingerprint that tells
    an exact repeat of the previous batch). Sampled steps add the norm, nonzero and finite
    counts; the finite count is -1 (all of them) where a CPU batch's min and max are
    finite. A channels-last batch is read in its memory order (`reductions.dense`); one with
    gaps is copied once; a sparse one through its stored values; a half-precision one is
    weighed in float32 (its ramp would round above 256)."""
    if x.layout != torch.strided:
        x = reductions.stored_values(x)
    xf = x if x.is_floating_point() else x.float()
    flat = reductions.dense(xf)
    flat = (xf.contiguous() if flat is None else flat).view(-1)
    mn, mx = reductions.min_max(flat)
    pos = {"min": into.add(mn), "max": into.add(mx)}  # (views: no op to stack them)
    if flat.numel() <= ONE_OP_MAX:
        pos["sum"] = into.add_row(_sums(flat, ramps))
        pos["print"] = pos["sum"] + 1
    else:
        pos["sum"] = into.add(flat.sum(dtype=reductions.acc_dtype(flat)))
        pos["print"] = into.add(_weighed(flat, ramps))
    if rich:
        pos["norm"] = into.add(torch.linalg.vector_norm(flat, dtype=reductions.acc_dtype(flat)))
        finite = reductions.known_finite(mn, mx)
        pos["nonzero"] = into.add(reductions.nonzero_count(flat, finite))
        pos["finite"] = -1 if finite else into.add(torch.isfinite(flat).sum())
    return pos


RAMP_MAX = 1 << 20
"""The longest weight vector of `Ramps` (4 MB in float32): a larger batch (an image batch
of 38 MB on an accelerator) is weighed by position modulo this, a dot product per slice,
instead of holding a ramp as large as the batch."""


ONE_OP_MAX = 1 << 16
"""Batches of up to this many elements get their sum and weighted sum in one op (`_sums`):
there the fixed cost of an op right after a training step is most of its cost."""


def _sums(flat: torch.Tensor, ramps: Ramps) -> torch.Tensor:
    """(sum, weighted sum) of a batch of up to `ONE_OP_MAX` elements, as one product with
    the rows of ones and weights of `Ramps` (half precision widened to float32 first)."""
    wide = flat if flat.element_size() >= 4 else flat.float()
    return torch.mv(ramps.like(wide), wide)


def _weighed(flat: torch.Tensor, ramps: Ramps) -> torch.Tensor:
    """sum(w[i mod `RAMP_MAX`] * flat[i]) with the weights of `Ramps`: one pass, in dot
    products."""
    wide = flat if flat.element_size() >= 4 else flat.float()
    if wide.numel() <= ONE_OP_MAX:
        return _sums(wide, ramps)[1]
    ramp = ramps.like(wide[:RAMP_MAX])
    n = wide.numel()
    if n <= RAMP_MAX:
        return torch.dot(wide, ramp)
    return torch.stack([torch.dot(wide[i:i + RAMP_MAX], ramp[:min(RAMP_MAX, n - i)])
                        for i in range(0, n, RAMP_MAX)]).sum()


def _ragged(args: tuple | dict) -> bool:
    """Is the first argument that holds a tensor a ragged batch: a list or tuple of three
    tensors or more, samples of unlike lengths (their first dimension) and like otherwise
    (`model(sequences, lengths)`, one tensor a sequence)? Its first tensor is one sample,
    not the batch: summarised, a sequence of ones would read "input batch is constant".
    Such a batch is not recorded. Inputs and labels (`[x, y]`) share their first
    dimension, the batch's, and are not one."""
    values = args.values() if isinstance(args, dict) else args
    arg = next((a for a in values if first_tensor(a, floating=False) is not None), None)
    if not isinstance(arg, (list, tuple)) or len(arg) < 3:
        return False
    shapes = [t.shape for t in arg if isinstance(t, torch.Tensor)]
    return (len(shapes) == len(arg) and len({s[1:] for s in shapes}) == 1
            and len({s[:1] for s in shapes}) > 1)


class Inputs:
    """The input batches of one watch's step, summarised on the step's `Scalars` and held
    for capture.

    With several models, a model's input may be another watched model's output (a GAN's
    generator feeds its discriminator) or made from one to take gradients (WGAN-GP's
    interpolates): neither is data. The models' outputs of this step and the last are
    held for that test (`model_output`), so that their memory cannot be a new batch's."""

    def __init__(self, models: Models, sc: reductions.Scalars, hold: bool) -> None:
        """`hold`: keep the batch for capture."""
        self._models = models
        self._sc = sc
        self._hold = hold
        self._ramps = Ramps()  # the fingerprint's weights
        self._fingerprint: step_row.Fingerprint | None = None  # the last step's batches'
        self.called_with: weakref.ref[torch.Tensor] | None = None
        """The tensor a watched model was last called with (`StepOwner.trains_the_input`)."""
        self._outs: list[torch.Tensor] = []
        self._prev_outs: list[torch.Tensor] = []
        self.loaders = LoaderIterators()
        """The DataLoaders' iterators, followed from the first batch recorded (`record`)
        until `release`: only a watch that hears its model is attached."""
        self._released = False
        self.new_step(sampled=True)

    def new_step(self, sampled: bool) -> None:
        """A step starts; `sampled` gets the full summary."""
        self._sampled = sampled
        self._batches: list[tuple[dict[str, int], int]] = []  # (positions, elements)
        self._given = False  # a batch was given by hand (`Probe.log_input`) in this step
        self.batch: torch.Tensor | None = None
        """The step's last batch, held for capture."""
        self._prev_outs, self._outs = self._outs, []

    @property
    def pending(self) -> bool:
        """A batch was recorded since the step began."""
        return bool(self._batches)

    def record(self, args: tuple, kwargs: dict, given: bool = False) -> None:
        """A top-level call of a watched model that trains: its first tensor is the batch,
        unless it is not data (see the class). `given`: the batch comes from the loop
        itself (`Probe.log_input`), and the models' own calls in this step are not
        recorded as batches besides it."""
        if not self._released:
            self.loaders.attach()  # idempotent
        source: tuple | dict = args
        found = first_tensor(args, floating=False)
        if found is None:
            source, found = kwargs, first_tensor(kwargs, floating=False)
        if found is None or found.numel() == 0 or found.is_complex() or _ragged(source):
            return
        if given:
            self._given = True
        else:
            self.called_with = weakref.ref(found)
            if self._given:
                return
        if not given and len(self._models.root_modules) > 1:  # another model's output?
            if found.requires_grad:  # computed from one (WGAN-GP's interpolates), or made
                return  # to take gradients: with several models, not the data
            at = storage_at(found)
            if at and any(storage_at(o) == at for o in (*self._outs, *self._prev_outs)):
                return  # another watched model's output, or a view of it: not data
        batch = found.detach()
        self.loaders.fed(batch)
        summary = input_batch(batch, self._sampled, self._sc, self._ramps)
        self._batches.append((summary, batch.numel()))
        if self._hold:
            self.batch = batch

    def model_output(self, output: object) -> None:
        """A top-level call of a watched model ended: with several models, its output is
        kept to be told from data (see the class)."""
        out = first_tensor(output, floating=False) if len(self._models.root_modules) > 1 \
            else None
        if out is not None and storage_at(out):
            self._outs.append(out.detach())

    def drop(self) -> None:
        """Forget the step's batches: what the model was fed is what the loop trains
        (`StepOwner.input_trained`), not data."""
        self._batches.clear()

    def read(self, v: list[float]) -> dict[str, float]:
        """After the transfer `v`: the step's input scalars (`step_row.input_scalars`)."""
        scalars, self._fingerprint = step_row.input_scalars(self._batches, v, self._fingerprint)
        scalars["in_reiter"], scalars["in_epoch_start"] = self.loaders.read()
        return scalars

    def release(self) -> None:
        """Drop what is held (the watch ends or failed)."""
        self._outs, self._prev_outs = [], []
        self._ramps.release()
        self._released = True
        self.loaders.detach()
