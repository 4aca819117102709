"""Hooks that never break the training they watch (`guarded`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

Hook = TypeVar("Hook", bound=Callable[..., Any])


def guarded(hook: Hook) -> Hook:
    """A hook method that never breaks the training it watches: an error of the engine's
    own (a bug, a model it does not understand) goes to its object's `_fail(exc, where)`,
    which stops the watch and lets the training go on; once the object's `failed` is set,
    the hook returns at once. What the watch raises on purpose (`TrainingFailure`) goes
    through: the watch's `on_error` raises it again. `where` is the hook's name without
    its leading underscore (a note names it). The wrapper takes positional arguments only,
    as PyTorch calls hooks: no keyword dict is made per call. It returns what the hook
    returns (an optimizer's pre-hook may give the step's arguments anew), None where the
    hook failed or did not run."""
    where = hook.__name__.lstrip("_")

    @functools.wraps(hook)
    def run(self: Any, *args: Any) -> Any:
        if self.failed:
            return None
        try:
            return hook(self, *args)
        except Exception as exc:  # noqa: BLE001 - any error of ours: the training must go on
            self._fail(exc, where)
            return None

    return run  # type: ignore[return-value]
