"""`watch()`: a live run, tying recording, detection and captures to one `Run`.

It schedules detection scans and captures and measures its own cost as training runs.
"""
