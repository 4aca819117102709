"""Find the loss: the scalar tensor that `backward()` is called on.

PyTorch has no hook for "backward was called", so while at least one watch is active we
wrap `torch.autograd.backward` (which `Tensor.backward` calls) with a dispatcher that hands
the root tensors to every listener, then calls the original. The wrapper is installed when
the first listener subscribes and the original is put back when the last one leaves, so
nothing outlives the watches (and nested watches share one wrapper).
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


def _dispatch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        root = tensors[0] if isinstance(tensors, (tuple, list)) and len(tensors) == 1 else tensors
        if isinstance(root, torch.Tensor) and root.numel() == 1 and root.is_floating_point():
            for listener in _listeners:
                listener(root)
        return original(tensors, *args, **kwargs)

    return backward


def subscribe(listener: Listener) -> Callable[[], None]:
    """Start hearing backward roots; returns an idempotent unsubscribe function."""
    global _original
    with _lock:
        if not _listeners:
            _original = torch.autograd.backward
            torch.autograd.backward = _dispatch(_original)
        _listeners.append(listener)

    done = False

    def unsubscribe() -> None:
        global _original
        nonlocal done
        with _lock:
            if done:
                return
            done = True
            _listeners.remove(listener)
            if not _listeners and _original is not None:
                torch.autograd.backward = _original
                _original = None

    return unsubscribe
