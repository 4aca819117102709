"""The run's record: steps x layers numeric columns (numpy only, no torch).

Recording appends to it, detection reads it, reports save and load it.
"""

from .columns import HOOK_GAP, LAYER_COLUMNS, REAPPLIED, ROLES, WEIGHT_PROBE, LayerInfo, Trace

__all__ = ["HOOK_GAP", "LAYER_COLUMNS", "REAPPLIED", "ROLES", "WEIGHT_PROBE", "LayerInfo", "Trace"]
