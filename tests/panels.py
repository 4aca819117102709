"""The panel a view just displayed, found as a notebook finds it: among the live widgets."""

from __future__ import annotations

from typing import Any


def shown_panel() -> Any:
    """The newest `Panel` alive (`ndbg.show` displays one and returns nothing)."""
    from ipywidgets.widgets.widget import _instances

    from neuraldbg_nb.notebook.panel import Panel

    panels = [w for w in list(_instances.values()) if isinstance(w, Panel)]
    assert panels, "no panel was displayed"
    return panels[-1]
