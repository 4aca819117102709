"""Find the loss: the scalar tensor that `backward()` is called on.

PyTorch has no hook for "backward was called", so while at least one watch is active we
wrap `torch.autograd.backward` (which `Tensor.backward` calls) with a dispatcher that hands
the root tensors to every listener, then calls the original. The wrapper is installed when
the first listener subscribes and the original is put back when the last one leaves, so
nothing outlives the watches (and nested watches share one wrapper). Where the program
wrapped `torch.autograd.backward` itself meanwhile (a profiler installed mid-run), its
wrapper stays, and ours inside it only passes the call on from then on.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

Listener = Callable[[torch.Tensor], None]

_lock = threading.Lock()
_listeners: list[Listener] = []
_original: Callable[..., Any] | None = None
_installed: Callable[..., Any] | None = None
"""The wrapper in place now; an older one left inside a wrapper of the program's passes
calls on without telling the listeners (they heard them from the newer one)."""


def _dispatch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        root = tensors[0] if isinstance(tensors, (tuple, list)) and len(tensors) == 1 else tensors
        if backward is _installed and isinstance(root, torch.Tensor) and root.numel() == 1 \
                and root.is_floating_point():
            for listener in _listeners:
                listener(root)
        return original(tensors, *args, **kwargs)

    return backward


def subscribe(listener: Listener) -> Callable[[], None]:
    """Start hearing backward roots; returns an idempotent unsubscribe function."""
    global _original, _installed
    with _lock:
        if not _listeners:
            _original = torch.autograd.backward
            _installed = torch.autograd.backward = _dispatch(_original)
        _listeners.append(listener)

    done = False

    def unsubscribe() -> None:
        global _original, _installed
        nonlocal done
        with _lock:
            if done:
                return
            done = True
            _listeners.remove(listener)
            if not _listeners and _original is not None:
                if torch.autograd.backward is _installed:  # (else the program's own wraps it)
                    torch.autograd.backward = _original
                _original = _installed = None

    return unsubscribe
