"""When a live run scans for events (`ScanSchedule`)."""

from __future__ import annotations

import math
import time

from ..detect.detection import GRADIENT_PATIENCE, Detection, SampledWake, jump_held, rise_held, wake
from ..detect.thresholds import Thresholds
from ..trace.columns import Trace


class ScanSchedule:
    """When the live run scans for events: at once when the newest step looks like the
    start of a sudden one (`wake`), `patience` steps later where it looks like the start
    of a slow one (reported only once it has held that long: a scan before would find
    nothing), and for a rise of the loss or a gradient's jump only if it held
    (`rise_held`, `jump_held`: near a perfect fit both swing from batch to batch, and
    each swing cost a scan), else in batches sized so that scanning costs about `BUDGET`
    of the training time, and at least every `MAX_LATENCY` seconds. A dead or saturated
    fraction crossing its line (`SampledWake`) is scanned for `patience` steps later only
    where the run stops at its first error (`stops`): its tensors are captured at the
    sampled step either way, and a deep stack's half-dead layers cross at most sampled
    steps, each crossing a scan of several ms. Batching changes when events are found,
    never which (the scan is chunk-invariant), so `stop_on` stops at the step of a sudden
    failure and soon after a slow one. A scan costs a few ms however few its new steps
    (the detectors' fixed numpy work), so a small budget mostly means fewer, larger
    batches. While a view follows the run (a listener of the Run: the panel, a framework
    callback), which reads what detection has found, scans come at the view's pace
    (`view_latency`: as often as it refreshes, where scans then take at most
    `VIEW_BUDGET` of the time, and at least every `VIEW_MAX_LATENCY` seconds), so that
    what it shows is that late at most; otherwise `MAX_LATENCY` bounds it."""

    BUDGET = 0.001
    MAX_LATENCY = 2.0
    VIEW_LATENCY = 0.1
    """The panel's pace: it shows the run at most ten times a second
    (`notebook.panel.MAX_RATE`)."""
    VIEW_BUDGET = 0.01
    """The share of the wall time that scans for a view take at most, where a scan every
    `VIEW_LATENCY` would cost more: a deep model's scan (120 layers: about 8 ms) ten times
    a second would cost 8% of the training."""
    VIEW_MAX_LATENCY = 1.0
    """Seconds a view's events are late at most, whatever a scan costs: the panel
    refreshes at least once a second (`notebook.panel_budget.MAX_GAP`)."""
    MAX_INTERVAL = 10_000
    """Steps in a batch at most."""

    def __init__(self, thresholds: Thresholds, stops: bool = True) -> None:
        """`stops`: the run stops at its first error (`stop_on="error"`)."""
        self.thresholds = thresholds
        self.stops = stops
        self.interval = 1
        """Steps scanned in one batch: sized from what a scan costs (`scanned`) once a step
        is timed. The first step is scanned on its own: what is wrong from the start (a
        loss of the wrong form, a layer no optimizer holds) is found, captured and stopped
        at its own step; the batches are sized from that scan's cost at the next step,
        which pays no scan of its own unless `wake` marks it."""
        # steps to scan at: (the step whose gradient jump, or loss rise, to confirm
        # there), or None: scan regardless
        self._confirm: dict[int, tuple[int, int] | None] = {}
        self._sampled_wake = SampledWake()
        self.woken: list[int] = []  # layers whose sampled fraction crossed at the newest step
        self._step_time = 0.0  # an average of the step's wall time; 0 until measured
        self._last_step: float | None = None
        self._last_scan = time.perf_counter()
        self._act: list[float] | None = None  # the last measured activations' abs-max
        self._scan_cost = 0.0  # the last scan's time (s)

    @property
    def view_latency(self) -> float:
        """Seconds between two scans at most while a view follows the run: `VIEW_LATENCY`,
        or longer where scans that often would take more than `VIEW_BUDGET` of the time
        (never more than `VIEW_MAX_LATENCY`)."""
        return min(self.VIEW_MAX_LATENCY,
                   max(self.VIEW_LATENCY, self._scan_cost / self.VIEW_BUDGET))

    def _act_moved(self, trace: Trace, th: Thresholds) -> bool:
        """Where the layers' outputs are not measured every step (their hooks are on for
        some steps only), `wake` compares a measured step with an unmeasured one: here
        the newest measured activations are compared with the last measured ones, by
        `wake_jump` either way, or turned non-finite."""
        t = trace.n_steps - 1
        now = trace.col("act_absmax", t, t + 1)[0].tolist()
        if all(math.isnan(x) for x in now):  # not measured at this step
            return False
        before, self._act = self._act, now
        if before is None or t < 1 or any(not math.isnan(x) for x in trace.col(
                "act_absmax", t - 1, t)[0].tolist()):
            return False  # measured the step before too: `wake` compares them
        jump = th.wake_jump
        for b, x in zip(before, now):
            if x == math.inf and b < math.inf:
                return True
            if b > 0 and x > 0 and (x / b >= jump or b / x >= jump):
                return True
        return False

    def due(self, trace: Trace, detection: Detection, viewed: bool = False) -> bool:
        """Called after each recorded step: whether to scan now. `viewed`: a view follows
        the run (`view_latency`)."""
        now = time.perf_counter()
        self._time_step(now)
        step = trace.n_steps - 1
        th = self.thresholds
        # (NaN: a file from before the column, measured)
        measured = step >= 0 and trace.scalar("hooked", step, step + 1)[0] != 0
        woke = wake(trace, th, measured)
        if measured and self._act_moved(trace, th) and "sudden" not in woke:
            woke = frozenset({"sudden", *woke})
        self.woken = self._sampled_wake(trace, th)
        if (self.woken and self.stops) or "slow" in woke:
            self._confirm[step + th.patience] = None
        if "rise" in woke:
            self._held(step + th.patience, step, -1)
        if "jump" in woke:
            self._held(step + GRADIENT_PATIENCE - 1, -1, step)
        confirm = step in self._confirm
        if confirm and (held := self._confirm[step]) is not None:
            risen, jumped = held
            confirm = ((risen >= 0 and rise_held(trace, th, risen))
                       or (jumped >= 0 and jump_held(trace, th, jumped)))
        self._confirm = {s: h for s, h in self._confirm.items() if s > step}
        pending = trace.n_steps - detection.steps_done
        latency = self.view_latency if viewed else self.MAX_LATENCY
        return pending > 0 and ("sudden" in woke or confirm or pending >= self.interval
                                or now - self._last_scan >= latency)

    def _held(self, at: int, risen: int, jumped: int) -> None:
        """Scan at step `at` if the loss's rise at step `risen`, or the gradient's jump at
        step `jumped` (-1: none), held until then; a scan there regardless stays so."""
        if at in self._confirm:
            held = self._confirm[at]
            if held is None:
                return
            risen, jumped = max(risen, held[0]), max(jumped, held[1])
        self._confirm[at] = (risen, jumped)

    def _time_step(self, now: float) -> None:
        """Follow the step time from one step's end to the next. A pause between two
        steps (an evaluation pass, a block of the same watch entered again minutes
        later) is not a step: one interval counts for at most twice the average, so a
        pause raises it by a tenth at most. Counted whole, a 5 s pause would make the
        average of a 35 ms step 0.5 s, the batches of `BUDGET` one step long, and the next
        few dozen steps would each pay a scan (3 ms, 9% of the step)."""
        last, self._last_step = self._last_step, now
        if last is None:  # the first step: its start is not known
            return
        wall = now - last
        first = self._step_time == 0
        self._step_time = wall if first else \
            0.9 * self._step_time + 0.1 * min(wall, 2 * self._step_time)
        if first and self._scan_cost > 0:  # (the first step's scan: `interval`)
            self._size(self._scan_cost)

    def scanned(self, cost: float) -> None:
        """A scan ended, having taken `cost` seconds."""
        self._last_scan = time.perf_counter()
        self._scan_cost = cost
        if self._step_time > 0:
            self._size(cost)

    def _size(self, cost: float) -> None:
        """Batches of as many steps as scanning `cost` seconds a batch allows in `BUDGET`."""
        self.interval = max(1, min(self.MAX_INTERVAL,
                                   math.ceil(cost / (self.BUDGET * self._step_time))))
