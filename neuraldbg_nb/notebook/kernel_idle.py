"""Whether the kernel is between cells (`follow`, `wait_until_idle`): background work that
holds the interpreter (the chart renderer's imports) waits for a pause in the user's
work instead of slowing the cell that runs next."""

from __future__ import annotations

import threading
import time
from typing import Any

GRACE_S = 0.5
"""Seconds without a cell running before the kernel counts as idle: "Run All" starts the
next cell within milliseconds of the last one's end."""

_lock = threading.Lock()
_followed: set[int] = set()  # ids of the shells whose cell events are followed
_running = 0  # cells running now (a cell that runs another nests)
_idle_since: float | None = time.monotonic()  # None while a cell runs


def _started(*_: Any) -> None:
    global _running, _idle_since
    with _lock:
        _running += 1
        _idle_since = None


def _ended(*_: Any) -> None:
    global _running, _idle_since
    with _lock:
        _running = max(_running - 1, 0)
        if _running == 0:
            _idle_since = time.monotonic()


def follow(shell: Any) -> None:
    """Follow `shell`'s cells from the next one on (once per shell)."""
    if id(shell) in _followed:
        return
    _followed.add(id(shell))
    shell.events.register("pre_run_cell", _started)
    shell.events.register("post_run_cell", _ended)


def wait_until_idle(most_s: float) -> None:
    """Return once no cell has run for `GRACE_S` seconds, or after `most_s` seconds
    whatever runs (where no cell events are followed: at once)."""
    deadline = time.monotonic() + most_s
    while _followed:
        now = time.monotonic()
        with _lock:
            since = _idle_since
        if since is not None and now - since >= GRACE_S or now >= deadline:
            return
        time.sleep(0.05)
