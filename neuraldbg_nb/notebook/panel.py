"""The live panel under a training cell (an anywidget).

During the run it is fed by the run's step listener, throttled on the measured cost of
its updates to `panel_budget.BUDGET` of the cell's wall time and at most `MAX_RATE` a
second, yet refreshed at least every `panel_budget.MAX_GAP` seconds (`PanelBudget`; a long
run never trips Jupyter's message rate limit; each update is one message of bounded
size). After the run it answers the browser: a click opens the inspector, a
slider re-classifies the recorded run with the engine's pure detection; each request is
acknowledged with a custom message `{"answer": name}` once handled, whatever came of it, so
the panel can tell a kernel that does not answer from one that is working
(`js/requests.ts`). With a baseline run, the panel also says where the two part
(`report.compare`).
"""

from __future__ import annotations

import threading
import time
from importlib import resources
from typing import Any

try:
    import anywidget
    import traitlets
except ImportError as err:  # pragma: no cover - exercised only where anywidget is missing
    raise ImportError(
        "the neuraldbg panel needs anywidget, a dependency of neuraldbg_nb: pip install anywidget"
    ) from err

from ..detect.events import Event
from ..report import story
from ..report.run import Run
from . import panel_state
from .panel_budget import MAX_RATE, PanelBudget

__all__ = ["MAX_RATE", "Panel", "PanelBudget"]
HELP = "click an event or a cell of the map to inspect it; drag a slider to re-classify"
LIVE_HELP = ("the map fills live; clicks and sliders are answered when the cell finishes "
             "(or stops at the failure)")


def _static(name: str) -> Any:
    path = resources.files("neuraldbg_nb") / "static" / name
    if not path.is_file():
        raise FileNotFoundError(
            f"the panel's front end ({name}) is missing: it is built on install. Reinstall "
            f"with `pip install -e .` (needs npm), or build it with `npm install && npm run "
            f"build` in the project root.")
    return path


def _warm_charts(run: Run | None) -> None:
    """In the background: start the chart renderer (about a second, once a process), and
    with `run`, the run being over, make the inspector of its first failure
    (`inspector.prepare`), so the first click on an event does not wait for either.
    Started when training ends, or with the panel of a finished run: started with a
    training's panel, the work would compete with the training's first steps and delay
    the panel's first paint."""
    def warm() -> None:
        try:
            from .inspector import prepare, warm_up
            warm_up()
            if run is not None:
                prepare(run)
        except Exception:  # noqa: BLE001 - a failed warm-up only means a slower first chart
            return

    threading.Thread(target=warm, name="neuraldbg-chart-warmup", daemon=True).start()


class Panel(anywidget.AnyWidget):
    _esm = _static("panel.js")

    layers = traitlets.List(traitlets.Unicode()).tag(sync=True)
    status = traitlets.Unicode("training").tag(sync=True)
    step = traitlets.Int(0).tag(sync=True)
    loss = traitlets.Bytes(b"").tag(sync=True)
    map = traitlets.Bytes(b"").tag(sync=True)
    map_cols = traitlets.Int(0).tag(sync=True)
    map_steps = traitlets.List(traitlets.Int(), [0, 0]).tag(sync=True)
    map_values = traitlets.Bytes(b"").tag(sync=True)
    map_act = traitlets.Bytes(b"").tag(sync=True)
    markers: traitlets.List = traitlets.List().tag(sync=True)
    first_failure = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    likely_causes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    events: traitlets.List = traitlets.List().tag(sync=True)
    thresholds = traitlets.Dict().tag(sync=True)
    sliders: traitlets.List = traitlets.List().tag(sync=True)
    selected = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)
    inspector_html = traitlets.Unicode("").tag(sync=True)
    message = traitlets.Unicode("").tag(sync=True)
    cost = traitlets.Unicode("").tag(sync=True)
    cost_detail = traitlets.Unicode("").tag(sync=True)
    notes = traitlets.List(traitlets.Unicode()).tag(sync=True)
    baseline = traitlets.Dict(allow_none=True, default_value=None).tag(sync=True)

    def __init__(self, run: Run, baseline: Run | None = None, baseline_name: str | None = None,
                 **kwargs: Any) -> None:
        """The panel of `run`; with `baseline` (a run of the same recipe, e.g. yesterday's),
        it says where `run` parts from it, once `run` is over (`panel_state.baseline`)."""
        super().__init__(**kwargs)
        self.run = run
        self.original = run
        self.baseline_run = baseline
        self.baseline_name = baseline_name
        self.budget = PanelBudget()
        """The panel's updates while training and what they cost (`PanelBudget`)."""
        self._notes_pushed = 0  # notes the last push carried: a new one is pushed at once
        self._unsubscribe = run.subscribe(self._on_step)
        if run.status != "training":  # (a training run's warm-up waits for its end: the
            _warm_charts(run)  # imports hold the interpreter, and would delay its first steps)
        self.observe(self._on_thresholds, names="thresholds")
        self.observe(self._on_selected, names="selected")
        self.push(force=True)

    # -- kernel -> browser ------------------------------------------------------------
    def _on_step(self, run: Run, new: list[Event]) -> None:
        if run.status != "training":
            self.push(force=True)
            _warm_charts(run)
            run.prepare_reclassify()  # so that the first slider move is as fast as the next
            return
        # the first recorded step is shown at once (the first paint), whatever the budget
        self.push(force=len(run.notes) != self._notes_pushed or self.step == 0)

    def push(self, force: bool = False) -> None:
        """Send the run's state, as often as its measured cost allows (`PanelBudget`):
        all of it, or the header alone where a full update is not due; all of it at once
        with `force`."""
        kind = "full" if force else self.budget.due()
        if kind is None:
            return
        started = self.budget.clock()
        if kind == "header":
            with self.hold_sync():
                for name, value in panel_state.header_state(self.run).items():
                    setattr(self, name, value)
        else:
            self._send_all()
        self.budget.paid(kind, started, forced=force)

    def _send_all(self) -> None:
        """Send every trait (the per-cell numbers too once training is over)."""
        self._notes_pushed = len(self.run.notes)
        done = self.run.status != "training"
        state = panel_state.panel_state(self.run, with_values=done, base=self.baseline_run,
                                        base_name=self.baseline_name)
        with self.hold_sync():
            for name, value in state.items():
                setattr(self, name, value)
            if not self.thresholds:
                self.thresholds = panel_state.thresholds(self.run)
            nothing = done and story.watched_nothing(self.run) is not None
            self.message = LIVE_HELP if not done else "" if nothing else HELP

    # -- browser -> kernel ------------------------------------------------------------
    def _answer(self, name: str) -> None:
        """Tell the browser its request `name` (a trait it wrote) was handled."""
        self.send({"answer": name})

    def _on_thresholds(self, change: dict[str, Any]) -> None:
        try:
            wanted = dict(change["new"] or {})
            current = panel_state.thresholds(self.run)
            if self.run.status == "training" or not wanted or wanted == current:
                return
            try:
                self.reclassify(**wanted)
            except (TypeError, ValueError) as err:
                self.message = f"thresholds not applied: {err}"
        finally:
            self._answer("thresholds")

    def reclassify(self, **changes: float) -> Run:
        """Re-judge the recorded run under new thresholds and redraw everything."""
        from ..live import watcher

        started = time.perf_counter()
        new = self.original.reclassify(self.run.thresholds, **changes)
        watcher.replace_last_run(self.run, new)
        self.run = new
        self.push(force=True)
        self.message = (f"re-classified {new.trace.n_steps} steps x {new.trace.n_layers} "
                        f"layers in {1000 * (time.perf_counter() - started):.0f} ms: "
                        f"{sum(e.severity == 'error' for e in new.events)} errors")
        if self.selected:  # the inspector shows the new verdicts too
            self._on_selected({"new": self.selected})
        return new

    def _on_selected(self, change: dict[str, Any]) -> None:
        try:
            sel = change["new"]
            if not sel:
                self.inspector_html = ""
                return
            from .inspector import inspector_html

            self.inspector_html = inspector_html(self.run, sel.get("layer"),
                                                 int(sel.get("step", 0)))
        finally:
            self._answer("selected")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget view, with a text/plain that says what it is (`notebook.static`)."""
        from .static import panel_bundle

        return panel_bundle(super()._repr_mimebundle_(**kwargs))

    def close(self) -> None:
        self._unsubscribe()
        super().close()
