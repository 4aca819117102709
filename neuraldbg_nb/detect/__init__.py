"""Detection: pure functions of the trace and the thresholds.

`detect(trace, thresholds)` gives the states and events of a whole run; a `Detection`
advanced step by step during a live run gives the same answer, because each detector is
causal (a step's codes depend on that step and the `window` before it) and the event
machine carries its state across chunks. Each detector is a module of its own, listed in
`detection.DETECTORS`; `rootcause` names the first failure and `causes` its likely causes.
"""

from .causes import Cause, likely_causes
from .detection import DETECTORS, Detection, detect, history_rows, keep_baselines
from .events import Event, Kind
from .rootcause import first_failure, symptoms
from .states import StateMap
from .thresholds import Thresholds

__all__ = ["DETECTORS", "Cause", "Detection", "Event", "Kind", "StateMap", "Thresholds",
           "detect", "first_failure", "history_rows", "keep_baselines", "likely_causes",
           "symptoms"]
