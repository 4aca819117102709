"""What a replayed forward may change besides the numbers it computes, saved before the
replay and put back after it (`Saved`), so that the training goes on as if no replay had
run.

A forward can draw random numbers (torch's generators, Python's `random`, numpy's, a
generator the model holds), update its models' buffers (running statistics), and change
its modules' own attributes: a counter of calls (`self.t += 1`), a list it logs to, a
cache it rebinds, a plain tensor it updates in place. Each of these is saved and put
back: the random states, every buffer, and each module's attributes (the object each name
held, the contents of its lists, dicts, sets and deques, the values of its plain tensors
up to `TENSOR_BYTES` in all). What lies outside the models (a global of the user's
script, a file the forward writes) cannot be put back: `changed` names what was found
changed and not restored, for the run's notes. Warnings the replay raises are not shown:
the training's own call showed its warnings already.
"""

from __future__ import annotations

import random
import warnings
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

TENSOR_BYTES = 16 << 20
"""The most bytes of plain tensor attributes (neither parameters nor buffers) copied before
a replay to be put back where it changes them in place; larger ones are only watched
(`changed`)."""

_MODULE_OWN = frozenset(nn.Module().__dict__)
"""`nn.Module`'s own attributes (its parameters', buffers', children's and hooks'
dicts): never a forward's state, and never restored by contents."""

_CONTAINERS = (list, dict, set, deque)


def rng_state() -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The CPU's generator state and, where CUDA is initialised, every device's."""
    dev = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), dev


def set_rng_state(state: tuple[torch.Tensor, list[torch.Tensor] | None]) -> None:
    cpu, dev = state
    torch.set_rng_state(cpu)
    if dev is not None:
        torch.cuda.set_rng_state_all(dev)


class Saved:
    """The state a replay of `modules`' forwards may change, taken now; `restore` puts it
    back. Entered as a context, it also keeps the replay's warnings from being shown."""

    def __init__(self, modules: list[nn.Module], generators: Sequence[Any] = ()) -> None:
        """`generators`: random generators outside the modules that the replay draws
        from (the forward's arguments)."""
        self._torch = rng_state()
        self._python = random.getstate()
        self._numpy = np.random.get_state()
        every = list({id(m): m for root in modules for m in root.modules()}.values())
        self._buffers = [(b, b.detach().clone()) for m in every for b in m.buffers(recurse=False)]
        self._attrs: list[tuple[nn.Module, dict[str, Any]]] = []
        self._contents: list[tuple[Any, Any]] = []
        self._generators: list[tuple[Any, Any]] = [
            (g, generator_state(g)) for g in {id(g): g for g in generators}.values()]
        self._tensors: list[tuple[str, torch.Tensor, int, torch.Tensor | None]] = []
        room = TENSOR_BYTES
        for m in every:
            own = {k: v for k, v in m.__dict__.items() if k not in _MODULE_OWN}
            self._attrs.append((m, own))
            for k, v in own.items():
                if isinstance(v, _CONTAINERS):
                    self._contents.append((v, list(v.items()) if isinstance(v, dict) else list(v)))
                elif type(v) is torch.Tensor and v.layout == torch.strided:
                    size = v.numel() * v.element_size()
                    copy = v.detach().clone() if size <= room else None
                    room -= size if copy is not None else 0
                    self._tensors.append((f"{type(m).__name__}.{k}", v, v._version, copy))
                else:
                    state = generator_state(v)
                    if state is not None:
                        self._generators.append((v, state))
        self.changed: list[str] = []
        """Attributes the replay changed in place that could not be put back (tensors
        beyond `TENSOR_BYTES`), by module class and name."""
        self._shown: Any = None

    def __enter__(self) -> None:
        self._shown = warnings.showwarning
        warnings.showwarning = _silent

    def __exit__(self, *exc: object) -> None:
        warnings.showwarning = self._shown
        self.restore()

    def restore(self) -> None:
        """Put back what the replay may have changed (see the module's docstring)."""
        set_rng_state(self._torch)
        random.setstate(self._python)
        np.random.set_state(self._numpy)
        with torch.no_grad():
            for b, saved in self._buffers:
                b.copy_(saved)
            for name, t, version, copy in self._tensors:
                if t._version != version:
                    if copy is None:
                        self.changed.append(name)
                    else:
                        t.copy_(copy)
        for m, own in self._attrs:
            d = m.__dict__
            for k in [k for k in d if k not in _MODULE_OWN and k not in own]:
                del d[k]  # (set by the replay)
            for k, v in own.items():
                if d.get(k, _MISSING) is not v:
                    d[k] = v
        for container, items in self._contents:
            _refill(container, items)
        for g, state in self._generators:
            set_generator_state(g, state)


_MISSING = object()


def _silent(*args: object, **kwargs: object) -> None:
    """`warnings.showwarning` during a replay: nothing shown."""


def _refill(container: Any, items: list[Any]) -> None:
    """Give `container` its saved contents (`items`: its elements, or a dict's items)
    again where they changed, in place (the loop may hold it). Compared by identity: the
    values may be tensors, whose `==` is elementwise."""
    if isinstance(container, dict):
        now: list[Any] = [x for kv in container.items() for x in kv]
        was = [x for kv in items for x in kv]
    else:
        now, was = list(container), items
    if len(now) == len(was) and all(a is b for a, b in zip(now, was)):
        return
    container.clear()
    if isinstance(container, (dict, set)):
        container.update(items)
    else:
        container.extend(items)


def generator_state(g: object) -> Any:
    """The state of a random generator a module holds (torch's, numpy's, Python's), or
    None where `g` is none."""
    if isinstance(g, torch.Generator):
        return g.get_state()
    if isinstance(g, np.random.Generator):
        return g.bit_generator.state
    if isinstance(g, (np.random.RandomState, random.Random)):
        return g.get_state() if isinstance(g, np.random.RandomState) else g.getstate()
    return None


def set_generator_state(g: Any, state: Any) -> None:
    if isinstance(g, torch.Generator):
        g.set_state(state)
    elif isinstance(g, np.random.Generator):
        g.bit_generator.state = state
    elif isinstance(g, np.random.RandomState):
        g.set_state(state)
    else:
        g.setstate(state)
