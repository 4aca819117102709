"""The torch side: hooks that measure one step of training into the trace.

Everything here runs inside the user's training (forward and optimizer hooks, the loss
tap) or at the step boundary; it only records. Classification lives in `detect`.
"""
