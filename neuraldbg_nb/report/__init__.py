"""What a user reads of a run: `Run`, its story, its captures, save and load.

Reports read the trace and the detection; they never hook or train.
"""
