"""Taking captures: CPU copies of a live run's tensors, kept within the run's budget.

Room is made before anything is copied (references only fill free room; an event capture
pushes out references, oldest first, then later event captures), so the store and the copy
in flight never hold more than the budget together. Large copies get pages of their own
(`OWN_PAGES`) and freed heap pages go back to the system (`TRIM_AFTER`).
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import math
import mmap
import sys
from collections.abc import Callable
from operator import itemgetter

import torch

from ..record.reductions import dense, stored_values
from ..report.captures import EVENT, REFERENCE, REFERENCE_BYTES, Capture, Captures

_STEP = itemgetter(0)  # the step of a (step, layer) key


class CaptureStore(Captures):
    """A live run's captures: `add` copies tensors to the CPU under the budget."""

    def __init__(self, budget_bytes: int) -> None:
        super().__init__(budget_bytes)
        # eviction order without a sort per add: keys by step, one list per reason
        self._order: dict[str, list[tuple[int, str | None]]] = {REFERENCE: [], EVENT: []}
        self._freed = 0  # bytes evicted since the heap was last trimmed

    def add(self, step: int, layer: str | None, reason: str,
            tensors: dict[str, torch.Tensor | None],
            shared: dict[tuple[object, int], torch.Tensor] | None = None) -> Capture | None:
        """Copy `tensors` to the CPU and keep them, evicting as needed; None if they
        cannot fit at all. Room is made before anything is copied, so the store and the
        copy in flight never hold more than the budget together. `shared`: the copies of
        the step's captures so far, by source tensor, for the caller to pass to each of
        them: a tensor two layers share (one's output is the next one's input) is copied
        once, and counted in each capture that holds it (the budget is never exceeded)."""
        if self.budget == 0 or (step, layer) in self._items:
            return self._items.get((step, layer))
        if reason == REFERENCE and self.nbytes >= self.budget:
            return None  # full: do not even copy
        per_tensor = max(self.budget // 4, 1)
        if reason == REFERENCE:
            per_tensor = min(per_tensor, REFERENCE_BYTES)
        sources: dict[str, object] = {}  # name -> the memory it came from (`_source`)
        sizes: dict[object, int] = {}
        for name, t in tensors.items():
            if t is not None:
                sources[name] = _source(t)
                sizes[sources[name]] = t.numel() * t.element_size()
        caps = _shares(sizes, per_tensor, self.budget // 2)
        views: dict[str, torch.Tensor] = {}
        sampled = set()
        for name, t in tensors.items():
            if t is None:
                continue
            t = t.detach()
            size, room = t.numel() * t.element_size(), caps[sources[name]]
            if size > room:
                stride = math.ceil(size / room)
                if t.layout != torch.strided:
                    flat = stored_values(t)
                else:  # memory order: no copy of a channels-last tensor to sample it
                    dense_t = dense(t)
                    flat = t.reshape(-1) if dense_t is None else dense_t.view(-1)
                t = flat[::stride]
                sampled.add(name)
            views[name] = t
        unique = {sources[name]: t for name, t in views.items()}
        need = sum(t.numel() * t.element_size() for t in unique.values())
        if not self._make_room(need, reason):
            self.dropped += reason == EVENT
            return None
        copies: dict[object, torch.Tensor] = {}
        for i, t in unique.items():  # (a source lives while the step's captures are taken)
            copy = None if shared is None else shared.get((i, caps[i]))
            if copy is None:
                copy = _host_copy(t)
                if shared is not None:
                    shared[(i, caps[i])] = copy
            copies[i] = copy
        cap = Capture(step, layer, reason, {name: copies[sources[name]] for name in views},
                      frozenset(sampled))
        self._items[(step, layer)] = cap
        bisect.insort(self._order[reason], (step, layer), key=_STEP)
        self.nbytes += cap.nbytes
        return cap

    def _make_room(self, need: int, reason: str) -> bool:
        if need > self.budget:
            return False
        if self.nbytes + need <= self.budget:
            return True
        if reason == REFERENCE:
            return False  # references only fill free room; they never push anything out
        refs, events = self._order[REFERENCE], self._order[EVENT]
        while self.nbytes + need > self.budget and (refs or len(events) > 1):
            # references oldest first; then events last in, first out (by step, and in
            # the order they came within one): the first failure's capture, the first
            # of the earliest step, stays
            self._evict(refs.pop(0) if refs else events.pop())
        if self._freed >= TRIM_AFTER:
            self._freed = 0
            _release_freed_memory()
        return self.nbytes + need <= self.budget

    def _evict(self, key: tuple[int, str | None]) -> None:
        cap = self._items.pop(key)
        self.nbytes -= cap.nbytes
        self._freed += cap.nbytes


def _shares(sizes: dict[object, int], per_tensor: int, total: int) -> dict[object, int]:
    """The bytes each tensor of one capture may keep (a larger one is kept as a strided
    sample): at most `per_tensor` each and `total` together, so that a capture of many
    large tensors (a layer's input, output, weights and their gradients) is sampled
    further instead of dropped, and leaves room for others. The room is shared out
    smallest first: a bias kept whole leaves the rest to the large tensors."""
    caps: dict[object, int] = {}
    left = max(total, len(sizes))
    for k, (key, size) in enumerate(sorted(sizes.items(), key=lambda kv: kv[1])):
        caps[key] = max(min(size, per_tensor, left // (len(sizes) - k)), 1)
        left -= min(caps[key], size)
    return caps


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _source(t: torch.Tensor) -> object:
    """What `t`'s values are: its memory and how it reads it, for a plain strided tensor
    with memory of its own (a layer's output and the next layer's input are one tensor
    seen through two objects, one of them detached); else the object (a subclass such as
    a DTensor wraps others and has no memory of its own to tell them apart by)."""
    if type(t) not in _PLAIN or t.layout != torch.strided or t.is_quantized \
            or t.device.type == "meta":
        return id(t)
    at = t.data_ptr()
    return (at, t.dtype, t.device, t.shape, t.stride()) if at else id(t)


OWN_PAGES = 1 << 18
"""Copies of at least this many bytes get pages of their own (an anonymous mmap) instead
of the C allocator's heap, which is the training's. Copies kept there for minutes sit
between the training's temporaries: its large buffers do not fit the holes and are
mapped afresh every step (thousands more page faults per step for a small CNN: time the
step spends in the kernel), and the holes that evicted copies leave are kept by the
allocator (resident memory grows to 1.6 x the budget). Pages of their own go back to the
system as soon as a capture is evicted and never mix with the training's memory."""


TRIM_AFTER = 4 << 20
"""Bytes evicted before the heap's free pages are handed back to the OS. `malloc_trim`
walks the whole heap (about a millisecond); once per eviction it would cost a 100-layer
model, whose captures are small and many, 1% of its step time. Large copies are unmapped
at eviction anyway, but trimming after them also hands back the training's own free heap
(tens of MB of peak resident memory: `benchmarks/memory.py`), so they count too."""


_PRIVATE_PAGES: dict[str, int] = (
    {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)}
    if hasattr(mmap, "MAP_ANONYMOUS") else {})
"""Private pages, mapped in one go: an anonymous mmap is shared memory by default, whose
page faults cost more, and faulting the pages in one by one as the copy first touches
them costs more again; together they make a 1 MB copy take about twice as long. Windows
has no flags: its default."""


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of `t`; large dense ones in pages of their own (see `OWN_PAGES`)."""
    size = t.numel() * t.element_size()
    if size < OWN_PAGES or t.layout != torch.strided or t.is_quantized:
        return t.to("cpu", copy=True)
    pages = mmap.mmap(-1, size, **_PRIVATE_PAGES)  # unmapped when its last tensor is freed
    out = torch.frombuffer(pages, dtype=t.dtype, count=t.numel()).view(t.shape)
    out.copy_(t)
    return out


def _load_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None


_MALLOC_TRIM = _load_trim()


def _release_freed_memory() -> None:
    """After evictions (`TRIM_AFTER`), hand the heap's free pages back to the OS. Large
    copies have pages of their own and are unmapped at once; small ones (and, glibc being
    one heap, whatever else is free in it) are kept by glibc until trimmed, which would
    leave resident memory tens of MB above the budget once the store is full
    (`benchmarks/memory.py`)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
