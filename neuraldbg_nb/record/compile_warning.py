"""torch.compile's warning about global module hooks, kept quiet while the watch's own is in.

A watch given no model finds the models as they are first called, through a global module
pre-hook. Calling a `torch.compile`d module while any global hook exists makes PyTorch warn,
at every call, that "there are global hooks on modules": hooks the user never installed.
The watch's hook only looks for models (it records nothing for the compiled wrapper), so
the warning says nothing true of the user's program; it is filtered while the hook is in,
and the user's own filters are left as they were.
"""

from __future__ import annotations

import warnings
from typing import Any, cast

MESSAGE = r"Using `torch\.compile\(module\)` when there are global hooks on modules"


def quiet() -> Any:
    """Filter the warning; returns the filter, to give back to `restore`."""
    warnings.filterwarnings("ignore", message=MESSAGE, category=UserWarning)
    return warnings.filters[0]


def restore(entry: Any) -> None:
    """Remove the filter `quiet` added (other filters added since stay)."""
    try:
        cast(list, warnings.filters).remove(entry)
    except ValueError:  # the user's code reset the filters (catch_warnings exited)
        return
    warnings._filters_mutated()  # type: ignore[attr-defined]
