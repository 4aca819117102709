"""The DataLoaders' iterators: is the one the step's batch came from made anew at every
step and dropped after a batch?

`x, y = next(iter(loader))` inside the loop makes a new iterator each step, takes its first
batch and drops it: the model trains on the first batch of an epoch over and over (with
`shuffle=True`, on a random one each time: the epoch is never gone through). Nothing in
the numbers tells it from a loop that goes through the loader; the loader itself does.

While a watch follows them (`LoaderIterators.attach` to `detach`), `DataLoader.__iter__`
and the iterators' `__next__` are wrapped on their classes: the wrappers return what the
originals return, unchanged, and the instances are not touched (they pickle and behave as
before); the classes are restored when the last watch detaches. Each iterator is followed
by a weak reference (its end is a callback) and the memory address of the first tensor
of each batch it yields. At each step boundary `read` tells whether the batch the model
was fed (`fed`) came from an iterator made in the step and dropped before its epoch
ended. A validation batch peeked at with `next(iter(val_loader))` beside the training
loader's iterator is not the batch the model trains on, and is not counted; where the
batch trained on matches no yielded batch (moved to an accelerator, or transformed on
the way), the step counts where none of the iterators made before it yielded a batch.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from .layers import first_tensor, storage_at

_ORIGINAL = DataLoader.__iter__
_ORIGINAL_NEXT = _BaseDataLoaderIter.__next__
_ACTIVE: weakref.WeakSet[LoaderIterators] = weakref.WeakSet()


@functools.wraps(_ORIGINAL)
def _iter(self: DataLoader) -> Any:
    it = _ORIGINAL(self)
    for watcher in list(_ACTIVE):
        watcher.made(self, it)
    return it


@functools.wraps(_ORIGINAL_NEXT)
def _next(self: _BaseDataLoaderIter) -> Any:
    batch = _ORIGINAL_NEXT(self)
    for watcher in list(_ACTIVE):
        watcher.yielded(self, batch)
    return batch


def _install() -> None:
    if DataLoader.__dict__.get("__iter__") is _ORIGINAL:
        DataLoader.__iter__ = _iter  # type: ignore[method-assign]
    if _BaseDataLoaderIter.__dict__.get("__next__") is _ORIGINAL_NEXT:
        _BaseDataLoaderIter.__next__ = _next  # type: ignore[method-assign]


def _uninstall() -> None:
    if DataLoader.__dict__.get("__iter__") is _iter:
        DataLoader.__iter__ = _ORIGINAL  # type: ignore[method-assign]
    if _BaseDataLoaderIter.__dict__.get("__next__") is _next:
        _BaseDataLoaderIter.__next__ = _ORIGINAL_NEXT  # type: ignore[method-assign]


@dataclass
class _Followed:
    ref: weakref.ref[Any]
    batches: float
    """The loader's batches in an epoch (inf: it has no length)."""
    fresh: bool = True
    """Made since the last step boundary."""
    count: int = 0
    """Batches yielded since it was made."""
    now: int = 0
    """Batches yielded since the last step boundary."""
    at: set[int] = field(default_factory=set)
    """Addresses of the batches it yielded since the last step boundary."""


class LoaderIterators:
    """The iterators of DataLoaders made while a watch follows them."""

    def __init__(self) -> None:
        self._followed: dict[int, _Followed] = {}
        self._ended: list[_Followed] = []  # followed iterators that ended since the boundary
        self._fed: set[int] = set()  # addresses of the batches the model was fed
        self._older = False  # an iterator made before the watch followed yielded a batch
        self.seen = False
        """A DataLoader's iterator was made while followed."""
        self.failed = False
        """Following broke (an iterator unlike PyTorch's): `read` says nothing more."""

    def attach(self) -> None:
        """Follow the iterators made from now on (idempotent)."""
        _ACTIVE.add(self)
        _install()

    def detach(self) -> None:
        """Stop following; the classes are restored once no watch follows (idempotent)."""
        _ACTIVE.discard(self)
        if not _ACTIVE:
            _uninstall()
        self._followed.clear()
        self._ended.clear()
        self._fed.clear()

    def made(self, loader: DataLoader, it: Any) -> None:
        """`iter(loader)` returned `it`. Never raises: the loop's iterator is all that
        matters there."""
        try:
            try:
                batches = float(len(loader))
            except TypeError:  # an IterableDataset without a length
                batches = math.inf
            self.seen = True
            key = id(it)
            if key in self._followed:  # a persistent workers' iterator, reset
                self._followed[key] = _Followed(self._followed[key].ref, batches)
                return
            ref = weakref.ref(it, functools.partial(self._end, key))
            self._followed[key] = _Followed(ref, batches)
        except Exception:  # noqa: BLE001 - the user's loop must go on
            self.failed = True

    def yielded(self, it: Any, batch: Any) -> None:
        """`next(it)` returned `batch`. Never raises."""
        try:
            f = self._followed.get(id(it))
            if f is None or f.ref() is not it:
                self._older = True  # made before the watch followed: long-lived
                return
            f.count += 1
            f.now += 1
            t = first_tensor(batch, floating=False)
            if t is not None:
                f.at.add(storage_at(t))
        except Exception:  # noqa: BLE001 - the user's loop must go on
            self.failed = True

    def fed(self, batch: Any) -> None:
        """The model was fed `batch` (a tensor) in this step."""
        self._fed.add(storage_at(batch))

    def _end(self, key: int, _ref: weakref.ref[Any]) -> None:
        f = self._followed.pop(key, None)
        if f is not None:
            self._ended.append(f)

    def read(self) -> tuple[float, float]:
        """At a step boundary: (reiter, epoch start).

        reiter: the batches in an epoch of a loader whose iterator was made in this step
        and dropped before it went through them, where the model was fed one of its
        batches (or, where it was fed none that any iterator yielded, where no iterator
        made before this step yielded a batch in it); inf for a loader without a length, 0
        where there was none.

        epoch start: 1 where the step's batch was the first of an iterator that lives on
        (`for batch in loader:` begins an epoch), else 0: a schedule stepped once an epoch
        moves the learning rate at such a step.

        Both NaN where no DataLoader's iterator was ever made while followed."""
        fed, older, ended, live = self._fed - {0}, self._older, self._ended, \
            list(self._followed.values())
        self._ended, self._fed, self._older = [], set(), False
        if not self.seen or self.failed:
            return math.nan, math.nan
        dropped = [f for f in ended if f.fresh and 0 < f.count < f.batches]
        begun = [f for f in live if f.fresh and 0 < f.count == f.now]
        if any(fed & f.at for f in (*live, *ended)):  # the batch trained on is known
            dropped = [f for f in dropped if fed & f.at]
            begun = [f for f in begun if fed & f.at]
        elif older or any(not f.fresh and f.now for f in live):
            dropped = begun = []  # a long-lived iterator yielded in the step: the loop's
        for f in live:
            f.fresh, f.now, f.at = False, 0, set()
        return max((f.batches for f in dropped), default=0.0), float(bool(begun))
